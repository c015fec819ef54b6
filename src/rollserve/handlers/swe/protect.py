"""What the candidate patch may not change: the test infrastructure grading relies on.

The tests run in the same interpreter as the code under test, so a patch could make
them report success instead of fixing anything: a ``conftest.py`` whose hook rewrites
every outcome to "passed", a ``pytest.ini``/``tox.ini``/``setup.cfg``/``pyproject.toml``
with ``addopts = -p myplugin`` or ``python_files = nothing``, a ``sitecustomize.py``,
``usercustomize.py`` or ``.pth`` file that Python runs at start-up from a folder on
``sys.path`` (an editable install puts the repository there), an entry point in a
``*.egg-info``/``*.dist-info`` folder (a pytest plugin), a helper module in the tests
package (its ``__init__.py``, ``tests/utils.py``, a ``pytest_plugins`` module), or a
``pytest.py``/``_pytest``/``pluggy``/``py.py`` at the repository's root that shadows
the real one (``python -m pytest`` imports from the working folder first), or a NEW
module or package at the root whose name shadows the standard library or an
installed package (``iniconfig.py``, ``packaging/__init__.py``, ``argparse.py``: the
working folder, then pytest's rootdir, come before both on ``sys.path``), or the
runner of a repository's test command (``bin/test`` and SymPy's ``runtests.py``,
Django's ``tests/runtests.py``, R2E-Gym's ``run_tests.sh``, and any repository file
the test command names).

A fix never needs those: SWE-bench puts every change to a path with "test" in it in
the test patch, never in the gold patch, and changed packaging metadata only takes
effect after a reinstall that EVAL does not do. So every file whose path matches
``is_protected`` is the candidate's business no more: ``split`` separates those
files' changes (SWEOptions.protected_files: "drop" grades the rest, "fail" gives 0).
The patch is read line by line following its hunks' counts (``diffparse``): a file
header after a hunk, a path without its ``a/``/``b/`` prefix (``diff.noprefix``), a
binary patch or any line the reader cannot attribute makes its block protected too.
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache

from rollserve.handlers.swe import diffparse

# File names protected in any folder, and glob patterns for file and folder names.
# (pytest reads pytest.ini, .pytest.ini, pytest.toml, .pytest.toml, pyproject.toml,
# tox.ini and setup.cfg; conftest.py from every folder it collects.)
NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
        "tests.py",
        "runtests.py",
        "run_tests.sh",
    }
)
FILE_PATTERNS = ("*.pth", "*.egg-link", "test_*.py", "*_test.py")
FOLDERS = frozenset({"tests", "test", "testing"})
FOLDER_PATTERNS = ("*.egg-info", "*.dist-info")
ROOT_NAMES = frozenset({"pytest.py", "pytest", "_pytest", "pluggy", "py.py"})  # shadowing
# Test runners of known repositories' test commands (exact paths).
RUNNERS = frozenset(
    {
        "bin/test",
        "sympy/utilities/runtests.py",
        "sympy/testing/runtests.py",
        "sympy/utilities/pytest.py",
        "sympy/testing/pytest.py",
        "tests/runtests.py",
        "run_tests.sh",
    }
)
# What pytest itself imports (always shadowing, whatever is installed here).
PYTEST_DEPENDENCIES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "iniconfig",
        "packaging",
        "exceptiongroup",
        "tomli",
        "colorama",
        "pygments",
        "attr",
        "attrs",
        "setuptools",
        "pkg_resources",
        "_distutils_hack",
    }
)


@lru_cache(maxsize=1)
def shadowed_names() -> frozenset[str]:
    """Top-level module names a new root module may not take: the standard library's,
    pytest's dependencies and every package installed in this interpreter."""
    installed = {name.lower() for name in importlib.metadata.packages_distributions()}
    return frozenset({n.lower() for n in sys.stdlib_module_names} | PYTEST_DEPENDENCIES | installed)


def _parts(path: str) -> list[str]:
    return [p for p in path.lower().split("/") if p not in ("", ".")]


def shadows(path: str) -> bool:
    """Whether a NEW file at ``path`` is a root module or package that shadows the
    standard library or an installed package (``argparse.py``, ``iniconfig/__init__.py``)."""
    parts = _parts(path)
    if len(parts) == 1 and parts[0].endswith((".py", ".pyc", ".so", ".pyd")):
        module = parts[0].split(".", 1)[0]
    elif len(parts) == 2 and parts[1].split(".", 1)[0] == "__init__":
        module = parts[0]
    else:
        return False
    return module in shadowed_names()


def is_protected(path: str, runners: frozenset[str] = frozenset()) -> bool:
    """Whether a change to ``path`` (relative to the repository) is test infrastructure;
    ``runners``: more repository paths the test command runs. Case is ignored (a
    case-insensitive file system would load ``CONFTEST.py`` too)."""
    parts = _parts(path)
    if not parts or ".." in parts or ".git" in parts:
        return True  # not a path we understand, or git's own files: never trusted
    name = parts[-1]
    if name in NAMES or any(fnmatchcase(name, p) for p in FILE_PATTERNS) or parts[0] in ROOT_NAMES:
        return True
    if "/".join(parts) in RUNNERS or "/".join(parts) in {r.lower() for r in runners}:
        return True
    return any(part in FOLDERS or any(fnmatchcase(part, p) for p in FOLDER_PATTERNS) for part in parts)


@dataclass
class Split:
    kept: str  # the patch without the protected files' changes
    protected: list[str] = field(default_factory=list)  # the protected paths it changed


def split(patch: str, runners: frozenset[str] = frozenset()) -> Split:
    """Separate the changes to protected files from the rest of a ``git diff``
    (``runners``: more paths the test command runs). A file's block that the strict
    reader (``diffparse``) cannot account for line by line counts as protected, named
    with the reason, and so does text before the first block."""
    preamble, blocks = diffparse.parse(patch)
    if not blocks:
        return Split(patch) if not patch.strip() else Split("", ["(not a git diff)"])
    kept: list[str] = []
    protected = ["(text before the first diff)"] if preamble.strip() else []
    for block in blocks:
        hits = [p for p in block.paths if is_protected(p, runners)]
        hits += [p for p in block.created if shadows(p) and p not in hits]
        hits += [f"({problem}, in the diff of {', '.join(block.paths) or '?'})" for problem in block.problems]
        if hits:
            protected += hits
        else:
            kept.append(block.text)
    return Split("".join(kept), list(dict.fromkeys(protected)))

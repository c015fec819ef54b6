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
"""

from __future__ import annotations

import codecs
import importlib.metadata
import re
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache

# File names protected in any folder, and glob patterns for file and folder names.
# (pytest reads pytest.ini, .pytest.ini, pytest.toml, .pytest.toml, pyproject.toml,
# tox.ini and setup.cfg; conftest.py from every folder it collects.)
NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
                   "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                   "usercustomize.py", "tests.py", "runtests.py", "run_tests.sh"})
FILE_PATTERNS = ("*.pth", "*.egg-link", "test_*.py", "*_test.py")
FOLDERS = frozenset({"tests", "test", "testing"})
FOLDER_PATTERNS = ("*.egg-info", "*.dist-info")
ROOT_NAMES = frozenset({"pytest.py", "pytest", "_pytest", "pluggy", "py.py"})  # shadowing
# Test runners of known repositories' test commands (exact paths).
RUNNERS = frozenset({"bin/test", "sympy/utilities/runtests.py", "sympy/testing/runtests.py",
                     "sympy/utilities/pytest.py", "sympy/testing/pytest.py",
                     "tests/runtests.py", "run_tests.sh"})
# What pytest itself imports (always shadowing, whatever is installed here).
PYTEST_DEPENDENCIES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                                 "exceptiongroup", "tomli", "colorama", "pygments", "attr",
                                 "attrs", "setuptools", "pkg_resources", "_distutils_hack"})

_BLOCK = re.compile(r"^diff --git ", re.MULTILINE)
_MARKERS = ("--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to ")


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
    if not parts:
        return True  # not a path we understand: never trusted
    name = parts[-1]
    if name in NAMES or any(fnmatchcase(name, p) for p in FILE_PATTERNS) or parts[0] in ROOT_NAMES:
        return True
    if "/".join(parts) in RUNNERS or "/".join(parts) in {r.lower() for r in runners}:
        return True
    return any(part in FOLDERS or any(fnmatchcase(part, p) for p in FOLDER_PATTERNS)
               for part in parts)


def unquote(name: str) -> str:
    """A path as git writes it in a diff: C-quoted (``"a/t\\303\\251st.py"``) when it has
    unusual characters; a trailing tab when it has spaces."""
    name = name.removesuffix("\t")
    if len(name) >= 2 and name[0] == name[-1] == '"':
        raw = codecs.escape_decode(name[1:-1].encode("utf-8", "surrogateescape"))[0]
        return raw.decode("utf-8", "surrogateescape")
    return name


def _header_paths(rest: str) -> list[str]:
    """Both paths of a ``diff --git A B`` header: quoted ones, or ``a/X b/X``."""
    quoted = re.findall(r'"(?:[^"\\]|\\.)*"', rest)
    if quoted:
        return [unquote(q) for q in quoted]
    half = (len(rest) - 1) // 2
    if rest[half] == " " and rest[2:half] == rest[half + 3:]:
        return [rest[:half], rest[half + 1:]]
    return []


def block_paths(block: str) -> list[str]:
    """Every path one file's diff names (both sides of a rename), without a/ b/."""
    lines = block.split("\n")
    found = _header_paths(lines[0].removeprefix("diff --git "))
    for line in lines[1:]:
        if line.startswith("@@"):
            break  # the hunks: their lines are the file's content, not headers
        for marker in _MARKERS:
            if line.startswith(marker):
                found.append(unquote(line[len(marker):]))
    paths = []
    for path in found:
        if path == "/dev/null":
            continue
        paths.append(path[2:] if path[:2] in ("a/", "b/") else path)
    return list(dict.fromkeys(paths))


@dataclass
class Split:
    kept: str  # the patch without the protected files' changes
    protected: list[str] = field(default_factory=list)  # the protected paths it changed


def new_paths(block: str) -> list[str]:
    """The paths one file's diff creates: a new file, a rename's or a copy's target."""
    lines = block.split("\n")
    new = any(line.startswith(("new file mode", "--- /dev/null")) for line in lines[1:8])
    made = []
    for line in lines[1:]:
        if line.startswith("@@"):
            break
        if line.startswith(("rename to ", "copy to ")):
            made.append(unquote(line.split(" to ", 1)[1]))
        elif new and line.startswith("+++ "):
            made.append(unquote(line[4:]))
    if new and not made:  # (an empty new file has no ---/+++ lines: the header's path)
        made = block_paths(block)[-1:]
    return [p[2:] if p[:2] in ("a/", "b/") else p for p in made]


def split(patch: str, runners: frozenset[str] = frozenset()) -> Split:
    """Separate the changes to protected files from the rest of a ``git diff``
    (``runners``: more paths the test command runs). A part whose paths cannot be read
    counts as protected."""
    starts = [m.start() for m in _BLOCK.finditer(patch)]
    if not starts:
        return Split(patch) if not patch.strip() else Split("", ["(not a git diff)"])
    kept: list[str] = []
    protected = ["(text before the first diff)"] if patch[:starts[0]].strip() else []
    for begin, end in zip(starts, [*starts[1:], len(patch)]):
        block = patch[begin:end]
        paths = block_paths(block)
        hits = [p for p in paths if is_protected(p, runners)] if paths else \
            ["(unreadable diff header)"]
        hits += [p for p in new_paths(block) if shadows(p) and p not in hits]
        if hits:
            protected += hits
        else:
            kept.append(block)
    return Split("".join(kept), list(dict.fromkeys(protected)))

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
the real one (``python -m pytest`` imports from the working folder first).

A fix never needs those: SWE-bench puts every change to a path with "test" in it in
the test patch, never in the gold patch, and changed packaging metadata only takes
effect after a reinstall that EVAL does not do. So every file whose path matches
``is_protected`` is the candidate's business no more: ``split`` separates those
files' changes (SWEOptions.protected_files: "drop" grades the rest, "fail" gives 0).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

# File names protected in any folder, and glob patterns for file and folder names.
NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                   "pyproject.toml", "sitecustomize.py", "usercustomize.py", "tests.py"})
FILE_PATTERNS = ("*.pth", "*.egg-link", "test_*.py", "*_test.py")
FOLDERS = frozenset({"tests", "test", "testing"})
FOLDER_PATTERNS = ("*.egg-info", "*.dist-info")
ROOT_NAMES = frozenset({"pytest.py", "pytest", "_pytest", "pluggy", "py.py"})  # shadowing

_BLOCK = re.compile(r"^diff --git ", re.MULTILINE)
_MARKERS = ("--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to ")


def is_protected(path: str) -> bool:
    """Whether a change to ``path`` (relative to the repository) is test infrastructure.
    Case is ignored (a case-insensitive file system would load ``CONFTEST.py`` too)."""
    parts = [p for p in path.lower().split("/") if p not in ("", ".")]
    if not parts:
        return True  # not a path we understand: never trusted
    name = parts[-1]
    if name in NAMES or any(fnmatchcase(name, p) for p in FILE_PATTERNS) or parts[0] in ROOT_NAMES:
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


def split(patch: str) -> Split:
    """Separate the changes to protected files from the rest of a ``git diff``. A part
    whose paths cannot be read counts as protected."""
    starts = [m.start() for m in _BLOCK.finditer(patch)]
    if not starts:
        return Split(patch) if not patch.strip() else Split("", ["(not a git diff)"])
    kept: list[str] = []
    protected = ["(text before the first diff)"] if patch[:starts[0]].strip() else []
    for begin, end in zip(starts, [*starts[1:], len(patch)]):
        block = patch[begin:end]
        paths = block_paths(block)
        hits = [p for p in paths if is_protected(p)] if paths else ["(unreadable diff header)"]
        if hits:
            protected += hits
        else:
            kept.append(block)
    return Split("".join(kept), list(dict.fromkeys(protected)))

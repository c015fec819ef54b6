"""Parse our own source files for the tests that scan them (layering, names), and read
their imports (``import_statements``: the layering tests' one reader).

CPython 3.11 before 3.11.8 can raise a spurious ``SystemError: AST constructor
recursion depth mismatch`` from ``ast.parse`` late in a long test session (its AST
converter's depth bookkeeping, gh-106905); the file is fine. Then it is parsed again
in a fresh interpreter and the tree comes back pickled.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_FRESH = "import ast, pickle, sys; p = sys.argv[1]; sys.stdout.buffer.write(pickle.dumps(ast.parse(open(p).read(), p)))"


def parse_source(path: Path) -> ast.Module:
    text = path.read_text()
    try:
        return ast.parse(text, str(path))
    except SystemError:
        done = subprocess.run([sys.executable, "-c", _FRESH, str(path)], capture_output=True, timeout=60, check=True)
        tree = pickle.loads(done.stdout)
        assert isinstance(tree, ast.Module)
        return tree


@dataclass(frozen=True)
class ImportStatement:
    """One import of a rollserve module as written: ``base`` is the module after
    ``from`` (relative imports resolved) or the one ``import`` names; ``modules`` the
    names a ``from`` imports that are modules themselves (``from pkg import module``);
    ``other_names`` whether it imports any name that is not a module."""

    line: int
    base: str
    modules: frozenset[str]
    other_names: bool


def import_statements(name: str, path: Path, known: set[str]) -> list[ImportStatement]:
    """Every import statement in the file of module ``name`` (anywhere: under
    ``TYPE_CHECKING``, inside functions), of rollserve modules only. ``known``: the
    modules that exist, to tell ``from pkg import module`` from ``from pkg import name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[ImportStatement] = []
    for node in ast.walk(parse_source(path)):
        if isinstance(node, ast.Import):
            found += [ImportStatement(node.lineno, alias.name, frozenset(), False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            modules = frozenset(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
            found.append(ImportStatement(node.lineno, base, modules, len(modules) < len(node.names)))
    return [s for s in found if s.base == "rollserve" or s.base.startswith("rollserve.")]

"""The routes depend on what they need of the service (``api.base.ApiService``), not
on the composition root: nothing in ``api`` imports ``rollserve.server``. (That
``server.Service`` satisfies the protocol is mypy's to prove, where the commands hand
a ``Service`` to ``create_app`` and ``serve``.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "src" / "rollserve" / "api"


def imported(source: str) -> set[str]:
    """Every module ``source`` imports (absolute), and each name it imports from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(API.glob("*.py")), ids=lambda p: p.name)
def test_api_does_not_import_the_composition_root(path: Path):
    found = {name for name in imported(path.read_text())
             if name == "rollserve.server" or name.startswith("rollserve.server.")}
    assert not found, f"{path.name} imports {sorted(found)}: depend on api.base.ApiService"


def test_the_scan_sees_both_spellings():
    assert "rollserve.server" in imported("from rollserve.server import Service")
    assert "rollserve.server" in imported("import rollserve.server")
    assert "rollserve.server.Service" in imported("def f():\n    from rollserve.server import Service")

"""The llm package's arrows run one way: backends, tokens and routing import the
contracts in ``llm.base`` (and their own package's modules), never one another's
internals (tokens may use ``backends.http``), and no two modules import each other,
directly or around a circle, not even under ``TYPE_CHECKING`` or inside a function.

Read from the source with ``ast`` (every import statement anywhere in a file), and
every module is imported too, so a module the graph misses cannot hide."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import rollserve.llm
from tests.source_ast import import_statements

LLM = Path(rollserve.llm.__file__).parent
PACKAGE = "rollserve.llm"

# Which llm modules each part may import (besides its own package's modules).
LEAVES = {"rollserve.llm.base", "rollserve.llm.bundled"}  # the contracts; the bundled model
ALLOWED: dict[str, set[str]] = {
    "rollserve.llm.base": set(),
    "rollserve.llm.bundled": {"rollserve.llm.base"},
    "rollserve.llm.slots": set(),  # the FIFO limit of the connection pools (and the engine's stage pools)
    "rollserve.llm.backends": LEAVES | {"rollserve.llm.slots"},
    "rollserve.llm.tokens": LEAVES | {"rollserve.llm.backends.http"},
    "rollserve.llm.routing": {"rollserve.llm.base"},
    "rollserve.llm.judges": {"rollserve.llm.base"},  # judges: backends of their own, no router
}
# What llm may import of the rest of rollserve: the neutral modules, nothing above it.
OUTSIDE = {"rollserve.errors", "rollserve.contract", "rollserve.faces"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LLM.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "rollserve." + ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(LLM.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """Every rollserve module ``path`` imports (``from pkg import module`` counts as the
    module when it is one, and as ``pkg`` too: importing it runs ``pkg``'s ``__init__``)."""
    found: set[str] = set()
    for statement in import_statements(name, path, known):
        found |= {statement.base} | statement.modules
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: {m for m in imported(name, path, known) if m in known and m != name} for name, path in found.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports (``[a, b, a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def part(name: str) -> str:
    """The part of llm a module belongs to (its subpackage, or base/bundled)."""
    pieces = name.split(".")
    return ".".join(pieces[:3]) if len(pieces) >= 3 else name


def wrong_arrows(edges: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, targets in sorted(edges.items()):
        if name == PACKAGE:
            allowed: set[str] = set()
        else:
            allowed = ALLOWED[part(name)]
        for target in sorted(targets):
            if part(target) == part(name) and target not in LEAVES:
                continue  # within one subpackage: only cycles are wrong there
            if target not in allowed:
                wrong.append(f"{name} -> {target}")
    return wrong


def test_every_llm_module_imports():
    for name in modules():
        importlib.import_module(name)


def test_llm_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_backends_tokens_and_routing_point_at_base():
    edges = graph()
    assert {
        "rollserve.llm.base",
        "rollserve.llm.routing.router",
        "rollserve.llm.tokens.chat",
        "rollserve.llm.backends.vllm",
    } <= set(edges)
    assert wrong_arrows(edges) == []


def test_llm_imports_nothing_above_it():
    found = modules()
    known = set(found)
    upward = sorted(
        f"{name} -> {target}"
        for name, path in found.items()
        for target in imported(name, path, known)
        if not target.startswith(PACKAGE)
        and target != "rollserve"
        and not any(target == o or target.startswith(o + ".") for o in OUTSIDE)
    )
    assert upward == []


# --- the checks themselves can fail ---------------------------------------------------------
def test_the_checks_catch_a_cycle_and_a_backward_arrow():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    edges = graph()
    edges["rollserve.llm.base"] = {"rollserve.llm.routing.router"}  # router -> ... -> base
    assert find_cycle(edges) is not None
    assert "rollserve.llm.base -> rollserve.llm.routing.router" in wrong_arrows(edges)
    assert wrong_arrows({"rollserve.llm.backends.vllm": {"rollserve.llm.tokens.chat"}}) == [
        "rollserve.llm.backends.vllm -> rollserve.llm.tokens.chat"
    ]


@pytest.mark.parametrize(
    "source,expected",
    [
        ("from rollserve.llm.tokens import chat", {"rollserve.llm.tokens", "rollserve.llm.tokens.chat"}),
        ("from . import chat", {"rollserve.llm.tokens", "rollserve.llm.tokens.chat"}),
        ("from ..base import Tokenizer", {"rollserve.llm.base"}),
        ("if TYPE_CHECKING:\n    from rollserve.llm.routing.router import Router", {"rollserve.llm.routing.router"}),
        ("def f():\n    import rollserve.llm.backends.http", {"rollserve.llm.backends.http"}),
    ],
)
def test_imports_are_read_wherever_they_are(tmp_path, source, expected):
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = set(modules())
    assert imported("rollserve.llm.tokens.mod", path, known) == expected

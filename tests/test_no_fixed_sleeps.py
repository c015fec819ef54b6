"""No fixed sleeps in the tests' own code: a test waits on the condition it needs, with a
bound (``tests/waiting.py``), never for a guessed time before it looks.

The rule, checked on every ``.py`` file under ``tests/``: a call of ``time.sleep``,
``asyncio.sleep`` or ``anyio.sleep`` (however imported) with any argument but the literal
``0`` is allowed only inside a nested function or a method of a non-``Test*`` class (test
doubles, fake servers, scripted policies: their sleep is the behaviour under test), or on a
line marked ``# sleep-ok: <why>``. So test functions, fixtures and module-level helpers
cannot sleep for a fixed time before asserting. ``sleep(0)`` (a bare yield) is always fine.
Sleeps inside command strings a test runs (``bash -c "sleep 30"``) are data, not calls,
and are not checked: they are the hanging tool a limit must kill.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_ast import parse_source

TESTS = Path(__file__).resolve().parent
MARK = "# sleep-ok:"
SLEEP_MODULES = {"time", "asyncio", "anyio", "trio"}


def _sleep_names(tree: ast.Module) -> set[str]:
    """Bare names bound to a sleep function (``from time import sleep``)."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in SLEEP_MODULES
        for alias in node.names
        if alias.name == "sleep"
    }


def _is_sleep(call: ast.Call, bare: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "sleep":
        return isinstance(func.value, ast.Name) and func.value.id in SLEEP_MODULES
    return isinstance(func, ast.Name) and func.id in bare


def _is_zero(call: ast.Call) -> bool:
    args = call.args or [k.value for k in call.keywords]
    return len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value == 0


class _Scan(ast.NodeVisitor):
    """Collects the sleeps of checked code: everything but nested functions and the
    methods of classes that are not ``Test*`` classes."""

    def __init__(self, bare: set[str], lines: list[str]):
        self.bare, self.lines = bare, lines
        self.depth = 0  # functions we are inside
        self.classes: list[str] = []
        self.found: list[int] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        exempt = self.depth > 0 or (self.classes and not self.classes[-1].startswith("Test"))
        if exempt:
            return  # a double's own code (its nested functions are exempt too)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if self.depth:
            return  # a class defined inside a test is a double
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_Call(self, node: ast.Call) -> None:
        if _is_sleep(node, self.bare) and not _is_zero(node):
            if MARK not in self.lines[node.lineno - 1]:
                self.found.append(node.lineno)
        self.generic_visit(node)


def fixed_sleeps(tree: ast.Module, text: str) -> list[int]:
    """Line numbers of the sleeps the rule forbids in one module."""
    scan = _Scan(_sleep_names(tree), text.splitlines())
    scan.visit(tree)
    return scan.found


def test_no_fixed_sleeps_in_tests():
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in fixed_sleeps(parse_source(path), path.read_text())
    ]
    assert not found, (
        "fixed sleeps in tests (wait on the condition with tests/waiting.py, "
        f"or mark a sleep that is the behaviour under test '{MARK} <why>'): {found}"
    )


PLANTED = """
import asyncio, time
from time import sleep as nap

async def test_sleep_then_assert(thing):
    thing.start()
    await asyncio.sleep(0.2)
    assert thing.done

def helper():
    nap(1)

@pytest.fixture
def server():
    for _ in range(3):
        time.sleep(0.1)

class TestGroup:
    def test_method(self):
        time.sleep(0.1)

class Slow:  # a double: its sleep is the behaviour
    async def reply(self):
        await asyncio.sleep(5)

def test_with_double():
    async def hang():
        await asyncio.sleep(60)
    time.sleep(0)
    time.sleep(1)  # sleep-ok: the process must be killed by then
"""


def test_the_rule_catches_a_planted_sleep_before_an_assert():
    tree = ast.parse(PLANTED)
    assert fixed_sleeps(tree, PLANTED) == [7, 11, 16, 20]

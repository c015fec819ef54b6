"""``all``/``any`` over a comprehension, unrolled so the server decides it.

``assert all(f(i) == i * i for i in range(5))`` would be one probe evaluated in the
test process, where the solution decides every comparison (an object that equals
everything, a patched ``all``). When each loop's iterable is known on the server (a
literal, or ``range`` of literal ints) the comprehension is expanded here, item by
item, with the loop variables replaced by their values: ``f(0) == 0 * 0``,
``f(1) == 1 * 1``, ... Each item is then compiled like any assert operand
(``code.asserts``): ``f(0)`` is a probe, the comparison runs on the server.
"""

from __future__ import annotations

import ast
import itertools
import math
from typing import Any

MAX_ITEMS = 1000  # of an unrolled comprehension
_POSITIONS = ("lineno", "col_offset", "end_lineno", "end_col_offset")
_SCALARS = (int, float, str, bytes, bool, type(None))


def unroll(node: ast.Call, free: set[str] | frozenset[str]) -> list[tuple[list[ast.expr], ast.expr]] | None:
    """For ``all(<comprehension>)`` / ``any(...)``: each item's (conditions, element),
    with the loop variables substituted; None when it cannot be unrolled here.
    ``free``: names that mean the builtins (``range``) in the assert."""
    if len(node.args) != 1 or node.keywords:
        return None
    comp = node.args[0]
    if not isinstance(comp, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        return None
    loops = _loops(comp, free)
    if loops is None:
        return None
    # Each item is parsed afresh from the text (faster than copying the tree).
    ifs = [ast.unparse(c) for g in comp.generators for c in g.ifs]
    element = ast.unparse(comp.elt)
    items: list[tuple[list[ast.expr], ast.expr]] = []
    for combination in itertools.product(*(values for _, values in loops)):
        binding: dict[str, Any] = {}
        for (target, _), value in zip(loops, combination):
            if not _bind(target, value, binding):
                return None
        conditions = [_substitute(c, binding) for c in ifs]
        items.append((conditions, _substitute(element, binding)))
        if len(items) > MAX_ITEMS:
            return None
    return items


def _loops(
    comp: ast.GeneratorExp | ast.ListComp | ast.SetComp, free: set[str] | frozenset[str]
) -> list[tuple[ast.expr, list[Any]]] | None:
    """Each loop's target and the values it takes, or None when a loop cannot be unrolled
    here: its iterable unknown on the server, async, a target that is not plain names,
    a loop variable rebound in the comprehension, or used by a later loop's iterable."""
    loops: list[tuple[ast.expr, list[Any]]] = []
    targets: set[str] = set()
    for generator in comp.generators:
        values = _iterable(generator.iter, free)
        if values is None or generator.is_async or not _names(generator.target, targets):
            return None
        loops.append((generator.target, values))
    if any(_rebinds(sub, targets) for sub in (comp.elt, *(i for g in comp.generators for i in g.ifs))):
        return None
    # A later loop's iterable or an earlier loop's condition using a variable: not here.
    if any(_uses(g.iter, targets) for g in comp.generators):
        return None
    return loops


def _iterable(node: ast.expr, free: set[str] | frozenset[str]) -> list[Any] | None:
    """The items of a literal iterable or of ``range(<int literals>)``, or None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "range"
        and "range" in free
        and not node.keywords
        and 1 <= len(node.args) <= 3
    ):
        try:
            bounds = [ast.literal_eval(a) for a in node.args]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if not all(type(b) is int for b in bounds):
            return None
        try:
            span = range(*bounds)
        except ValueError:  # a step of 0: Python raises it too, in the sandbox
            return None
        return list(span) if len(span) <= MAX_ITEMS else None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if type(value) in (list, tuple, str) and len(value) <= MAX_ITEMS:
        return list(value)
    return None  # a set's order, a dict's keys: left to the sandbox


def _names(target: ast.expr, into: set[str]) -> bool:
    if isinstance(target, ast.Name):
        into.add(target.id)
        return True
    if isinstance(target, ast.Tuple):
        return all(_names(t, into) for t in target.elts)
    return False  # a starred or attribute target


def _bind(target: ast.expr, value: Any, binding: dict[str, Any]) -> bool:
    if isinstance(target, ast.Name):
        if not _literal_value(value):
            return False
        binding[target.id] = value
        return True
    assert isinstance(target, ast.Tuple)
    if type(value) not in (tuple, list) or len(value) != len(target.elts):
        return False  # Python would raise in the sandbox: leave it there
    return all(_bind(t, v, binding) for t, v in zip(target.elts, value))


def _literal_value(value: Any) -> bool:
    if type(value) in (tuple, list):
        return all(_literal_value(v) for v in value)
    return type(value) in _SCALARS and not (type(value) is float and not math.isfinite(value))


def _rebinds(node: ast.AST, names: set[str]) -> bool:
    """Whether a nested scope or an assignment inside ``node`` binds one of ``names``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load) and sub.id in names:
            return True
        if isinstance(sub, ast.Lambda) and {a.arg for a in ast.walk(sub.args) if isinstance(a, ast.arg)} & names:
            return True
    return False


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(node))


class _Substitute(ast.NodeTransformer):
    def __init__(self, binding: dict[str, Any]):
        self.binding = binding

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.binding:
            return ast.parse(repr(self.binding[node.id]), mode="eval").body
        return node


def _substitute(text: str, binding: dict[str, Any]) -> ast.expr:
    """The expression ``text`` with the loop variables replaced by their values, and no
    source positions (its text is ``ast.unparse``'s, not the assert's)."""
    copied = _Substitute(binding).visit(ast.parse(text, mode="eval").body)
    for sub in ast.walk(copied):
        for name in _POSITIONS:
            if hasattr(sub, name):
                delattr(sub, name)
    return copied

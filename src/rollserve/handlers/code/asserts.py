"""Assert tests decided on the server, on plain values.

Each top-level ``assert`` of an instance is compiled into a ``Check``: the operands
that need the solution become *probes* (source text the sandbox evaluates and reports
as plain values, ``code.runner``), and the rest of the expression is evaluated here,
on the server, on the decoded values:

- literals (``ast.literal_eval``): the expected values. They never enter the sandbox.
- comparisons (``== != < <= > >= in not in is is not``, chained), ``and``/``or``/``not``,
  arithmetic (``+ - * / // % ** << >> & | ^``, unary ``- + ~``), subscripts and
  slices, tuple, list, set and dict displays;
- calls of a few pure functions (``code.operations``: ``abs len sorted round sum ...``
  and ``math.isclose ...``), ``math.pi ...`` and the plain type names. These are the
  real builtins whatever the solution defines; a name the setup code binds (or a call
  with a generator, a lambda or a keyword not listed) is a probe.

Operations with a cost that grows with their values are bounded there, so a crafted
value cannot stall the server.

Anything else is a probe as a whole (a call of the solution, ``x.method()``, a
comprehension). A probe's value must be plain (exact ``int``/``str``/``list``/...), so
an object that equals everything, an ``int`` subclass with its own ``__eq__`` or a
truthy object is no longer a value that passes. Python's ``==`` holds between plain
values: ``1 == 1.0 == True``, ``[1] != (1,)``; ``is True`` needs a real bool.

``all(...)``/``any(...)`` over a comprehension whose iterables are literals or
``range(<ints>)`` is unrolled item by item (``code.unroll``) and decided here too.

Probes that need only the setup code and the builtins (an expected value the setup
builds, ``pow(7, 2)``) are *reference* candidates: they are evaluated first in a
process that never imports the solution (``code.hidden_tests``), and where that gives
a plain value, the check uses it. A reference value the solution is handed in the
same check (``f(data) == data``) stands only when it is immutable: the solution may be
meant to change a list it is given.

A check is *unsafe* when its verdict would still rest on a judgement made in the
solution's process (``Check.unsafe``): a probe that compares, takes the truth of or
hands to a setup helper the solution's objects (``all``/``any``/``isinstance`` left
whole, a comprehension's ``if``, ``check(f)``); a reference candidate the run
without the solution could not compute (a setup value made with the solution, ``ok =
f(3) == 9``: the setup judged); or a comparison between two values that both come
from the solution's process. Unsafe checks fail or are left out (``unsafe_checks``).

Every probe is evaluated (Python's ``and``/``or`` would skip some; a probe the
verdict does not need may fail without failing the test).
"""

from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from rollserve.handlers.code.check import Check, CheckFailed, Node
from rollserve.handlers.code.names import BUILTINS, STAR, ProbeInfo, free_names, references
from rollserve.handlers.code.operations import BINARY, FUNCTIONS, MATH, MATH_CONSTANTS, PREDICATES, TYPES, binary
from rollserve.handlers.code.unroll import unroll
from rollserve.handlers.code.values import Probe

_NOT_LITERAL = object()

_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
    ast.Not: operator.not_,
}
# Calls inside a probe that judge the solution's objects in the sandbox.
_JUDGING_CALLS = {"all", "any", "bool", "isinstance", "issubclass", "callable", "hasattr", "filter"}


def compile_assert(source: str, bound: frozenset[str] = frozenset(), solution: frozenset[str] = frozenset()) -> Check:
    """The check of one assert statement (``source``); ``bound``: ``setup_names``;
    ``solution``: names known to be the solution's (the entry point)."""
    statement = ast.parse(source).body[0]
    if not isinstance(statement, ast.Assert):
        raise ValueError("not an assert statement")
    compiler = _Compiler(source, bound)
    evaluate, _ = compiler.node(statement.test, truth=True)
    message = _literal(statement.msg) if statement.msg is not None else None
    info = references(compiler.info, bound, solution)
    return Check(
        source,
        compiler.probes,
        info,
        compiler.pairs,
        evaluate,
        str(message)[:200] if message is not _NOT_LITERAL and message is not None else None,
    )


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


class _Compiler:
    def __init__(self, source: str, bound: frozenset[str]):
        self.source, self.bound = source, bound
        self.probes: list[str] = []
        self.info: list[ProbeInfo] = []
        self.pairs: list[tuple[frozenset[int], frozenset[int]]] = []

    def free(self, name: str) -> bool:
        """Whether ``name`` is the builtin (or module) the server's table names."""
        return name not in self.bound and STAR not in self.bound

    def node(self, node: ast.AST, truth: bool = False) -> tuple[Node, bool]:
        """(how to evaluate ``node`` here, whether it needs a probe)."""
        value = _literal(node)
        if value is not _NOT_LITERAL:
            return (lambda probes: value), False
        compiled = getattr(self, "_" + type(node).__name__, lambda n, t: None)(node, truth)
        return compiled if compiled is not None else self.probe(node, truth)

    def probe(self, node: ast.AST, truth: bool) -> tuple[Node, bool]:
        index, source = len(self.probes), self.text(node)
        self.probes.append(source)
        # The truth of what the solution returns is its own claim; of a value the setup
        # computed (``ok = f(3) == 9``), a judgement made in its process.
        returned = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and self.free(node.func.id)
            and node.func.id not in BUILTINS
        )
        setup_truth = truth and not returned and self._uses_setup(node)
        self.info.append(ProbeInfo(self._judges(node), setup_truth, free_names(node)))

        def value(probes: Sequence[Probe]) -> Any:
            probe = probes[index]
            if probe.kind == "value":
                return probe.value
            if probe.kind == "not_plain":
                raise CheckFailed(
                    "not_plain",
                    f"{source} is not a plain value ({probe.detail}): "
                    "only int, float, bool, str, bytes, None, list, "
                    "tuple, dict, set and frozenset compare",
                )
            if probe.kind == "too_large":
                raise CheckFailed("output_limit", f"{source}: {probe.detail}")
            memory = probe.detail.startswith("MemoryError")  # what ran out was the limit
            raise CheckFailed("memory" if memory else "error", f"{source}: {probe.detail}")

        return value, True

    def text(self, node: ast.AST) -> str:
        """``node``'s source as the test wrote it, where it stands alone as an expression."""
        segment = ast.get_source_segment(self.source, node)
        try:
            if segment is not None:
                ast.parse(segment, mode="eval")
                return segment
        except SyntaxError:  # a segment that spans lines outside its own brackets
            pass
        return ast.unparse(node)

    def _judges(self, node: ast.AST) -> str | None:
        """Why evaluating ``node`` in the sandbox judges the solution's objects there
        (compares them, takes their truth, or hands them to a setup helper), or None."""
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Compare, ast.BoolOp, ast.IfExp)) or (
                isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not)
            ):
                return "compares or takes the truth of values"
            if isinstance(sub, ast.comprehension) and sub.ifs:
                return "filters values"
            if isinstance(sub, ast.Call):
                root = sub.func
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(sub.func, ast.Attribute) and sub.func.attr in PREDICATES:
                    return f"calls .{sub.func.attr}()"
                if isinstance(root, ast.Name) and root.id in _JUDGING_CALLS and self.free(root.id):
                    return f"calls {root.id}()"
                if isinstance(root, ast.Name) and not self.free(root.id):
                    return f"calls {root.id}, which the setup code may define,"
        return None

    def _uses_setup(self, node: ast.AST) -> bool:
        return any(isinstance(sub, ast.Name) and not self.free(sub.id) for sub in ast.walk(node))

    # --- the node types evaluated on the server ------------------------------------
    def _Compare(self, node: ast.Compare, truth: bool) -> tuple[Node, bool]:
        operands, spans = [], []
        for operand in [node.left, *node.comparators]:
            start = len(self.probes)
            operands.append(self.node(operand))
            spans.append(frozenset(range(start, len(self.probes))))
        # Both sides from the sandbox: unless one has a reference value, unsafe.
        self.pairs.extend((a, b) for a, b in itertools.pairwise(spans) if a and b)
        ops = [_COMPARE[type(op)] for op in node.ops]
        first, rest = operands[0][0], [fn for fn, _ in operands[1:]]

        def compare(probes: Sequence[Probe]) -> Any:
            left = first(probes)
            result: Any = True
            for op, right_of in zip(ops, rest):
                right = right_of(probes)
                result = op(left, right)
                if not result:
                    return result
                left = right
            return result

        return compare, any(p for _, p in operands)

    def _BoolOp(self, node: ast.BoolOp, truth: bool) -> tuple[Node, bool]:
        values = [self.node(v, truth) for v in node.values]
        is_and = isinstance(node.op, ast.And)

        def boolean(probes: Sequence[Probe]) -> Any:
            result: Any = None
            for fn, _ in values:
                result = fn(probes)
                if bool(result) != is_and:
                    return result
            return result

        return boolean, any(p for _, p in values)

    def _UnaryOp(self, node: ast.UnaryOp, truth: bool) -> tuple[Node, bool]:
        operand, probed = self.node(node.operand, truth and isinstance(node.op, ast.Not))
        op = _UNARY[type(node.op)]
        return (lambda probes: op(operand(probes))), probed

    def _BinOp(self, node: ast.BinOp, truth: bool) -> tuple[Node, bool] | None:
        kind = type(node.op)
        if kind not in BINARY:
            return None
        (left, p1), (right, p2) = self.node(node.left), self.node(node.right)
        return (lambda probes: binary(kind, left(probes), right(probes))), p1 or p2

    def _Subscript(self, node: ast.Subscript, truth: bool) -> tuple[Node, bool]:
        value, probed = self.node(node.value)
        if isinstance(node.slice, ast.Slice):
            parts = [
                self.node(p) if p is not None else ((lambda probes: None), False)
                for p in (node.slice.lower, node.slice.upper, node.slice.step)
            ]
            probed = probed or any(p for _, p in parts)
            return (lambda probes: value(probes)[slice(*(fn(probes) for fn, _ in parts))]), probed
        index, p2 = self.node(node.slice)
        return (lambda probes: value(probes)[index(probes)]), probed or p2

    def _display(
        self, elements: Sequence[ast.expr | None], build: Callable[[list[Any]], Any]
    ) -> tuple[Node, bool] | None:
        present = [e for e in elements if e is not None]
        if len(present) < len(elements) or any(isinstance(e, ast.Starred) for e in present):
            return None  # {**other}, [*items]: evaluated in the sandbox as a whole
        items = [self.node(e) for e in present]
        return (lambda probes: build([fn(probes) for fn, _ in items])), any(p for _, p in items)

    def _List(self, node: ast.List, truth: bool) -> tuple[Node, bool] | None:
        return self._display(node.elts, list)

    def _Tuple(self, node: ast.Tuple, truth: bool) -> tuple[Node, bool] | None:
        return self._display(node.elts, tuple)

    def _Set(self, node: ast.Set, truth: bool) -> tuple[Node, bool] | None:
        return self._display(node.elts, set)

    def _Dict(self, node: ast.Dict, truth: bool) -> tuple[Node, bool] | None:
        if any(k is None for k in node.keys):  # {**other}
            return None
        flat = [x for pair in zip(node.keys, node.values) for x in pair]  # Python's order
        return self._display(flat, lambda xs: dict(zip(xs[::2], xs[1::2])))

    def _Name(self, node: ast.Name, truth: bool) -> tuple[Node, bool] | None:
        if node.id in TYPES and self.free(node.id):
            kind = TYPES[node.id]
            return (lambda probes: kind), False
        return None

    def _Attribute(self, node: ast.Attribute, truth: bool) -> tuple[Node, bool] | None:
        if (
            isinstance(node.value, ast.Name)
            and node.value.id == "math"
            and self.free("math")
            and node.attr in MATH_CONSTANTS
        ):
            constant = MATH_CONSTANTS[node.attr]
            return (lambda probes: constant), False
        return None

    def _Call(self, node: ast.Call, truth: bool) -> tuple[Node, bool] | None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("all", "any") and self.free(func.id):
            free = {name for name in ("range",) if self.free(name)}
            items = unroll(node, free)
            if items is not None:
                return self._quantifier(items, func.id == "all")
        if (
            isinstance(func, ast.Attribute)
            and func.attr in PREDICATES
            and not node.keywords
            and not any(isinstance(a, (ast.Starred, ast.GeneratorExp, ast.Lambda)) for a in node.args)
        ):
            return self._predicate(node, func)
        if isinstance(func, ast.Name) and func.id in FUNCTIONS and self.free(func.id):
            function, keywords = FUNCTIONS[func.id]
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "math"
            and self.free("math")
            and func.attr in MATH
        ):
            function, keywords = MATH[func.attr]
        else:
            return None
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if any(k.arg not in keywords for k in node.keywords) or any(
            isinstance(a, (ast.Starred, ast.GeneratorExp, ast.Lambda)) for a in arguments
        ):
            return None  # evaluated in the sandbox as a whole
        args = [self.node(a) for a in node.args]
        kwargs = [(k.arg, self.node(k.value)) for k in node.keywords if k.arg is not None]

        def call(probes: Sequence[Probe]) -> Any:
            return function(*(fn(probes) for fn, _ in args), **{name: fn(probes) for name, (fn, _) in kwargs})

        return call, any(p for _, p in args) or any(p for _, (_, p) in kwargs)

    def _predicate(self, node: ast.Call, func: ast.Attribute) -> tuple[Node, bool]:
        """``<value>.startswith(...)``, ``.isdigit()``, ``.issubset(...)``...: run here,
        on a plain receiver only."""
        (receiver, p1), args = self.node(func.value), [self.node(a) for a in node.args]
        name, owners, text = func.attr, PREDICATES[func.attr], self.text(func.value)

        def call(probes: Sequence[Probe]) -> Any:
            value = receiver(probes)
            if type(value) not in owners:
                raise CheckFailed(
                    "not_plain", f"{text} is a {type(value).__name__}, not one of the plain types with .{name}()"
                )
            return getattr(value, name)(*(fn(probes) for fn, _ in args))

        return call, p1 or any(p for _, p in args)

    def _quantifier(self, items: list[tuple[list[ast.expr], ast.expr]], is_all: bool) -> tuple[Node, bool]:
        """``all``/``any`` of unrolled items, decided here (``code.unroll``)."""
        compiled = [
            ([self.node(c, truth=True) for c in conditions], self.node(element, truth=True))
            for conditions, element in items
        ]

        def quantify(probes: Sequence[Probe]) -> bool:
            for conditions, (element, _) in compiled:
                if all(condition(probes) for condition, _ in conditions) and bool(element(probes)) != is_all:
                    return not is_all
            return is_all

        probed = any(p for conditions, element in compiled for _, p in [*conditions, element])
        return quantify, probed

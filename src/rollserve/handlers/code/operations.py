"""The operations an assert's check may run on the server, on plain values the
solution reported (``code.asserts``): arithmetic and a few pure functions, each
refused where a crafted value could make its cost unbounded (``ValueError``: "too
large for a server-side check").

- ``* / // % **`` on ints of at most ``MAX_INT_BITS`` bits (a ``**`` or ``<<`` whose
  result would be larger is refused before it runs); ``%`` formatting of strings is
  not supported.
- a sequence repeated (``[0] * n``) to at most ``MAX_ITEMS`` items.
- ``set()``/``frozenset()`` of at most ``MAX_SAME_HASH`` distinct items sharing a hash
  (``code.values.hashable``); ``sum()`` of numbers only; ``int()`` of strings of at
  most ``MAX_DIGITS`` characters; ``round(int, n)`` with ``|n| <= MAX_DIGITS``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rollserve.handlers.code.values import describe, hashable

MAX_INT_BITS = 1 << 17  # of an int operand of * / // % ** << (about 39,000 digits)
MAX_ITEMS = 1 << 22  # of a sequence a server-side * builds
MAX_DIGITS = 5000  # of a string int() converts

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
TYPES = {t.__name__: t for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)}


def _too_large(what: str) -> ValueError:
    return ValueError(f"{what} is too large for a server-side check")


def _ints(*values: Any, limit: int = MAX_INT_BITS) -> None:
    for value in values:
        if type(value) is int and value.bit_length() > limit:
            raise _too_large(f"an int of {value.bit_length()} bits")


def binary(kind: type[ast.operator], a: Any, b: Any) -> Any:
    """``a <op> b`` on plain values, refused where its cost could be unbounded."""
    sequence = (str, bytes, list, tuple)
    if kind is ast.Mult and (type(a) in sequence or type(b) in sequence):
        seq, times = (a, b) if type(a) in sequence else (b, a)
        if type(times) in (int, bool) and len(seq) * max(times, 0) > MAX_ITEMS:
            raise _too_large(f"a sequence of {len(seq)} repeated {times} times")
    elif kind is ast.Mod and type(a) in (str, bytes):
        raise TypeError("%-formatting is not supported in a server-side check")
    elif kind in (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod):
        _ints(a, b)
    elif kind is ast.Pow and type(a) in (int, bool) and type(b) in (int, bool) and abs(a) > 1:
        if b > 0 and a.bit_length() * b > MAX_INT_BITS:
            raise _too_large(f"{describe(a)} ** {b}")
    elif kind is ast.Pow:
        _ints(a, b, limit=1 << 16)
    elif kind is ast.LShift and type(a) in (int, bool) and type(b) in (int, bool) and a:
        if b > MAX_INT_BITS or a.bit_length() + b > MAX_INT_BITS:
            raise _too_large(f"{describe(a)} << {b}")
    return BINARY[kind](a, b)


def _round(number: Any, ndigits: Any = None) -> Any:
    if type(number) is int and type(ndigits) is int and abs(ndigits) > MAX_DIGITS:
        raise _too_large(f"round(..., {ndigits})")
    return round(number, ndigits)


def _sum(values: Any, start: Any = 0) -> Any:
    items = list(values)
    if not all(type(v) in (int, float, bool, complex) for v in [*items, start]):
        raise TypeError("sum() of anything but numbers is not supported in a server-side check")
    return sum(items, start)


def _int(value: Any, base: Any = None) -> int:
    if type(value) in (str, bytes) and len(value) > MAX_DIGITS:
        raise _too_large(f"a string of {len(value)} characters")
    return int(value) if base is None else int(value, base)


def _set(values: Any = ()) -> set:
    return set(hashable(list(values)))


def _frozenset(values: Any = ()) -> frozenset:
    return frozenset(hashable(list(values)))


def _one(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: function(value)  # one argument only: type(x), str(x)


# name: (function, the keywords allowed). Positional arguments are counted by the call.
FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "abs": (abs, ()),
    "all": (all, ()),
    "any": (any, ()),
    "bool": (bool, ()),
    "float": (float, ()),
    "frozenset": (_frozenset, ()),
    "int": (_int, ()),
    "isinstance": (isinstance, ()),
    "len": (len, ()),
    "list": (list, ()),
    "max": (max, ("default",)),
    "min": (min, ("default",)),
    "round": (_round, ()),
    "set": (_set, ()),
    "sorted": (sorted, ("reverse",)),
    "str": (_one(str), ()),
    "sum": (_sum, ("start",)),
    "tuple": (tuple, ()),
    "type": (_one(type), ()),
}
MATH: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "isclose": (math.isclose, ("rel_tol", "abs_tol")),
    "sqrt": (math.sqrt, ()),
    "floor": (math.floor, ()),
    "ceil": (math.ceil, ()),
    "fabs": (math.fabs, ()),
    "isnan": (math.isnan, ()),
    "isinf": (math.isinf, ()),
    "isfinite": (math.isfinite, ()),
}
# Predicate methods of the plain types (``s.startswith("ab")``, ``a.issubset(b)``):
# method name -> the plain types that have it. Run here on a reported value; on any
# other receiver they would be the solution's own method, answering True at will.
PREDICATES: dict[str, tuple[type, ...]] = {}
for _type in (str, bytes, set, frozenset, float, int):
    for _name in dir(_type):
        if _name.startswith("is") or _name in ("startswith", "endswith"):
            PREDICATES[_name] = (*PREDICATES.get(_name, ()), _type)
del _type, _name
MATH_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf, "nan": math.nan}

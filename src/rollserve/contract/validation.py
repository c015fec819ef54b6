"""Naming the field at fault in pydantic's errors, one way everywhere (API 4xx, CLI
errors, dataset reports): ``("body", "tasks", 0, "n")`` is ``tasks[0].n``.

Also the JSON a request may carry (``parse_json``): what Python's ``json`` accepts
but nothing downstream can hold is refused here, naming the field, before any of it
is stored, hashed or rendered: nesting deeper than ``MAX_JSON_DEPTH``, lone UTF-16
surrogates (``"\\ud800"``: not Unicode, so not storable as UTF-8), ``NaN`` and
infinities, integers outside 64 bits (SQLite's and most consumers' range), and bytes
that are not UTF-8.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

Location = tuple[str | int, ...]  # where in a value, as pydantic's error ``loc``
_REQUEST_PARTS = ("body", "query", "path")  # FastAPI's prefixes, not the user's fields

MAX_JSON_DEPTH = 64  # objects and arrays inside one another, the body itself counted
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MAX_PART_CHARS = 80  # a field name part longer than this is cut in messages
_MAX_PARTS_SHOWN = 12  # a deeper location is shown as its first parts and "..."


def _printable(part: str) -> str:
    """A key as it can appear in a message: lone surrogates escaped, long keys cut."""
    text = part.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= _MAX_PART_CHARS else text[:_MAX_PART_CHARS] + "..."


def field_name(loc: Iterable[str | int], empty: str = "body") -> str:
    """A pydantic error location as the user writes it: ``tasks[0].instance.question``."""
    out = ""
    for count, part in enumerate(loc):
        if part in _REQUEST_PARTS and not out:
            continue
        if count > _MAX_PARTS_SHOWN:
            return out + "..."
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = _printable(str(part))
            out += f".{part}" if out else part
    return out or empty


def describe(error: ValidationError, empty: str = "value") -> str:
    """Every problem of ``error`` as ``field: message``, joined by ``; ``."""
    return "; ".join(f"{field_name(e['loc'], empty)}: {e['msg']}" for e in error.errors())


class JSONInputError(ValueError):
    """JSON that no part of rollserve can hold; ``loc`` is where, as pydantic's."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        super().__init__(f"{field_name(loc)}: {message}")
        self.loc = loc
        self.message = message


def _no_constant(name: str) -> Any:
    raise JSONInputError((), f"{name} is not a JSON number (numbers must be finite)")


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``raw`` as JSON, or ``JSONInputError`` naming the first field that is refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONInputError((), f"not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise JSONInputError((), f"not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise JSONInputError((), f"nested deeper than {max_depth} levels") from None
    except JSONInputError:
        raise
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise JSONInputError(
            (), "a number has thousands of digits: integers must fit in 64 bits; send larger numbers as strings"
        ) from None
    check_json(value, max_depth)
    return value


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH, loc: Location = ()) -> None:
    """Raise ``JSONInputError`` at the first value no part of rollserve can hold (see the
    module doc). Iterative: a deep value cannot exhaust the stack here."""
    stack: list[tuple[Any, Location]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, (dict, list)):
            if len(where) - len(loc) >= max_depth:
                raise JSONInputError(where, f"nested deeper than {max_depth} levels")
            stack.extend(_children(item, where))
        else:
            _check_scalar(item, where)


def _children(item: dict[Any, Any] | list[Any], where: Location) -> Iterator[tuple[Any, Location]]:
    """The values of a JSON object (its keys checked as text) or array, with where they are."""
    if isinstance(item, list):
        yield from ((child, where + (i,)) for i, child in enumerate(item))
        return
    for key, child in item.items():
        _check_text(key, where + (key,), key=True)
        yield child, where + (key,)


def _check_scalar(item: Any, where: Location) -> None:
    """A string must be valid Unicode, an integer fit in 64 bits, a number be finite."""
    if isinstance(item, str):
        _check_text(item, where)
    elif isinstance(item, bool) or item is None:
        return
    elif isinstance(item, int):
        if not INT64_MIN <= item <= INT64_MAX:
            raise JSONInputError(where, "integer out of range (64-bit signed); send larger numbers as strings")
    elif isinstance(item, float) and not math.isfinite(item):
        raise JSONInputError(where, "number out of range (must be finite)")


def _check_text(text: str, where: Location, key: bool = False) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        what = "key" if key else "string"
        raise JSONInputError(
            where,
            f"the {what} holds a lone UTF-16 surrogate "
            f"({text[exc.start]!a} at character {exc.start}): "
            "not valid Unicode",
        ) from None

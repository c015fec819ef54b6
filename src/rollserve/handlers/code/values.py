"""The values an assert test reports, read strictly on the server.

The runner (``code.runner``, inside the sandbox) writes one JSON document per test:
``{"probes": [entry, ...]}``, an entry per value the assert needs from the solution.
Everything in it is the solution's claim and is read as untrusted input: any shape
other than the encoding below is refused, and only exact builtin types come out
(``None``, bool, int, float, str, bytes, list, tuple, dict, set, frozenset), nested at
most ``MAX_DEPTH`` deep. So the server's comparisons run on plain values whose
``==`` is Python's own, never on an object of the solution's.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 100
MAX_REPORT_BYTES = 4 << 20  # of encoded values per test; past it a probe is "too large"
MAX_SAME_HASH = 64  # distinct items of a set or dict that may share one hash
SHOWN = 80  # characters of a value in a test's detail

_HEX_INT = re.compile(r"-?0x[0-9a-f]+")
_HEX_BYTES = re.compile(r"(?:[0-9a-f]{2})*")
_COLLECTIONS = {"tuple": tuple, "set": set, "frozenset": frozenset}


class MalformedReport(ValueError):
    """The test's output is not a report of the runner (the solution wrote over it,
    or exited before the runner wrote one)."""


@dataclass
class Probe:
    """One reported value: ``kind`` is value | error | not_plain | too_large."""

    kind: str
    value: Any = None
    detail: str = ""  # the error, the type that is not plain, why too large


class _Object(list):
    """A JSON object, as its (key, value) pairs in order (duplicates kept)."""


def read_report(text: str, count: int) -> list[Probe]:
    """The ``count`` probes of a runner's report; raises MalformedReport."""
    try:
        document = json.loads(text, object_pairs_hook=_Object)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digits limit
        raise MalformedReport(f"not one JSON document ({type(exc).__name__})") from None
    entries = _single(document, "probes")
    if type(entries) is not list or len(entries) != count:
        raise MalformedReport(f"expected a list of {count} probe(s)")
    return [_probe(entry) for entry in entries]


def _single(node: Any, *keys: str) -> Any:
    """The value of a one-key JSON object whose key is one of ``keys``."""
    if type(node) is not _Object or len(node) != 1 or node[0][0] not in keys:
        raise MalformedReport(f"expected an object with one key of {', '.join(keys)}")
    return node[0][1]


def _probe(entry: Any) -> Probe:
    if type(entry) is not _Object or len(entry) != 1:
        raise MalformedReport("a probe entry is not an object with one key")
    kind, body = entry[0]
    if kind == "value":
        try:
            return Probe("value", decode(body))
        except (ValueError, TypeError, RecursionError) as exc:
            raise MalformedReport(f"a value is not in the plain encoding: {exc}") from None
    if kind in ("error", "not_plain", "too_large") and type(body) is str:
        return Probe(kind, detail=body[:300])
    raise MalformedReport(f"unknown probe entry {kind!r}")


def decode(node: Any, depth: int = 0) -> Any:
    """The plain value of an encoded one (see ``code.runner``); raises ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    kind = type(node)
    if node is None or kind in (bool, int, float, str):
        return node  # json.loads makes exact types
    if kind is list:
        return [decode(item, depth + 1) for item in node]
    if kind is not _Object:
        raise ValueError(f"a {kind.__name__} is not an encoded value")
    body = _single(node, "int", "bytes", "tuple", "set", "frozenset", "dict")
    name = node[0][0]
    if name == "int" and type(body) is str and _HEX_INT.fullmatch(body):
        return int(body, 16)  # a power-of-two base: no digit limit, linear time
    if name == "bytes" and type(body) is str and _HEX_BYTES.fullmatch(body):
        return bytes.fromhex(body)
    if name in _COLLECTIONS and type(body) is list:
        items = [decode(item, depth + 1) for item in body]
        return _COLLECTIONS[name](hashable(items) if name != "tuple" else items)
    if name == "dict" and type(body) is list:
        return _decode_dict(body, depth)
    raise ValueError(f"malformed {name!r} value")


def _decode_dict(body: list[Any], depth: int) -> dict[Any, Any]:
    """A dict encoded as its ``[key, value]`` pairs (keys checked: ``hashable``)."""
    pairs = []
    for pair in body:
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("a dict item is not a [key, value] pair")
        pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
    hashable([key for key, _ in pairs])
    return dict(pairs)


def hashable(items: list[Any]) -> list[Any]:
    """``items``, checked before they go into a set or a dict: hashable (TypeError), and
    no more than ``MAX_SAME_HASH`` distinct ones with one hash. Distinct ints that share
    a hash (multiples of 2**61 - 1) would otherwise make building the set quadratic:
    8,000 of them take 1.5 s, the hundred thousand a report can hold, hours."""
    counts = Counter(hash(item) for item in items)  # keyed by hash values: no collisions
    for value, count in counts.items():
        if count > MAX_SAME_HASH:
            group = [item for item in items if hash(item) == value]
            if any(not item == group[0] for item in group):
                raise ValueError(f"{count} items share one hash")
    return items


def immutable(value: Any) -> bool:
    """Whether a plain value can never change (no list, dict or set inside)."""
    if type(value) in (tuple, frozenset):
        return all(immutable(item) for item in value)
    return value is None or type(value) in (bool, int, float, complex, str, bytes)


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, SHOWN, SHOWN
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdict = 8


def describe(value: Any) -> str:
    """A short repr of a plain value, for a test's detail."""
    try:
        text = _repr.repr(value)
    except ValueError:  # an int past the str conversion limit
        text = f"<an int of {value.bit_length()} bits>" if type(value) is int else "<too large to show>"
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."

"""Naming the field at fault in pydantic's errors, one way everywhere (API 4xx, CLI
errors, dataset reports): ``("body", "tasks", 0, "n")`` is ``tasks[0].n``."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

_REQUEST_PARTS = ("body", "query", "path")  # FastAPI's prefixes, not the user's fields


def field_name(loc: Iterable[str | int], empty: str = "body") -> str:
    """A pydantic error location as the user writes it: ``tasks[0].instance.question``."""
    out = ""
    for part in loc:
        if part in _REQUEST_PARTS and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or empty


def describe(error: ValidationError, empty: str = "value") -> str:
    """Every problem of ``error`` as ``field: message``, joined by ``; ``."""
    return "; ".join(f"{field_name(e['loc'], empty)}: {e['msg']}" for e in error.errors())

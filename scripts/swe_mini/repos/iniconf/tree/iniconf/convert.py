"""Conversion of raw string values to Python types."""

from __future__ import annotations

from .errors import ConversionError

TRUE_STRINGS = frozenset({"1", "yes", "true", "on"})
FALSE_STRINGS = frozenset({"0", "no", "false", "off"})


def to_bool(value: str) -> bool:
    """Interpret *value* as a boolean.

    ``1/yes/true/on`` are true and ``0/no/false/off`` false, case-insensitively;
    anything else raises :class:`ConversionError`.
    """
    text = value.strip()
    if text.lower() in TRUE_STRINGS:
        return True
    if text in FALSE_STRINGS:
        return False
    raise ConversionError(f"not a boolean: {value!r}")


def to_int(value: str) -> int:
    """Interpret *value* as an integer; ``_`` separators and 0x/0o/0b prefixes are allowed."""
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise ConversionError(f"not an integer: {value!r}") from None


def to_float(value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise ConversionError(f"not a number: {value!r}") from None


def to_list(value: str, sep: str = ",") -> list[str]:
    """Split *value* on *sep* (or on newlines for multi-line values), dropping empty items."""
    if "\n" in value:
        items = value.splitlines()
    else:
        items = value.split(sep)
    return [item.strip() for item in items if item.strip()]

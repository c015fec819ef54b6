"""Strict parsing of ISO 8601 dates, spans and timestamps."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Optional

from .span import DateSpan

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_MONTH = re.compile(r"(\d{4})-(\d{2})")
_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,6}))?)?"
    r"(Z|z|[+-]\d{2}(?::?\d{2})?)?"
)
_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})?")


def parse_date(text: str) -> date:
    """Parse ``YYYY-MM-DD``. Raises :class:`ValueError` for anything else."""
    m = _DATE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a date (expected YYYY-MM-DD): {text!r}")
    return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def parse_span(text: str) -> DateSpan:
    """Parse ``START..END`` (end excluded) or ``YYYY-MM`` (a whole month)."""
    text = text.strip()
    if ".." in text:
        start, _, end = text.partition("..")
        return DateSpan(parse_date(start), parse_date(end))
    m = _MONTH.fullmatch(text)
    if m:
        return DateSpan.from_month(int(m.group(1)), int(m.group(2)))
    raise ValueError(f"not a span (expected START..END or YYYY-MM): {text!r}")


def parse_timestamp(text: str, default_tz: Optional[tzinfo] = None) -> datetime:
    """Parse ``YYYY-MM-DDTHH:MM[:SS[.ffffff]][offset]``.

    The offset may be ``Z``, ``+HH``, ``+HHMM`` or ``+HH:MM``. Without an
    offset the result has *default_tz* (naive when that is ``None``).
    """
    m = _TIMESTAMP.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not an ISO 8601 timestamp: {text!r}")
    year, month, day, hour, minute = (int(m.group(i)) for i in range(1, 6))
    second = int(m.group(6) or 0)
    micro = int((m.group(7) or "0").ljust(6, "0"))
    tz = _parse_offset(m.group(8)) if m.group(8) else default_tz
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)


def _parse_offset(text: str) -> tzinfo:
    if text in ("Z", "z"):
        return timezone.utc
    m = _OFFSET.fullmatch(text)
    if not m:
        raise ValueError(f"bad UTC offset: {text!r}")
    sign = -1 if m.group(1) == "-" else 1
    hours = int(m.group(2))
    minutes = int(m.group(3) or 0)
    if hours > 23 or minutes > 59:
        raise ValueError(f"bad UTC offset: {text!r}")
    return timezone(timedelta(hours=sign * hours, minutes=minutes))

"""Half-open spans of days."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Iterable, Iterator, List, Optional

from .dates import add_months, days_in_month


class DateSpan:
    """The days from *start* (included) to *end* (excluded).

    An empty span (``start == end``) is allowed; ``start > end`` is not.
    """

    __slots__ = ("start", "end")

    def __init__(self, start: date, end: date) -> None:
        if end < start:
            raise ValueError(f"span ends before it starts: {start} > {end}")
        self.start = start
        self.end = end

    @classmethod
    def from_month(cls, year: int, month: int) -> "DateSpan":
        """The whole of *month* of *year*."""
        first = date(year, month, 1)
        return cls(first, first + timedelta(days=days_in_month(year, month)))

    @classmethod
    def from_days(cls, start: date, days: int) -> "DateSpan":
        return cls(start, start + timedelta(days=days))

    # -- basic protocol ---------------------------------------------------

    def __len__(self) -> int:
        return (self.end - self.start).days

    def __bool__(self) -> bool:
        return self.end > self.start

    def __contains__(self, day: object) -> bool:
        return isinstance(day, date) and self.start <= day < self.end

    def __iter__(self) -> Iterator[date]:
        day = self.start
        while day < self.end:
            yield day
            day += timedelta(days=1)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DateSpan):
            return NotImplemented
        return (self.start, self.end) == (other.start, other.end)

    def __hash__(self) -> int:
        return hash((self.start, self.end))

    def __repr__(self) -> str:
        return f"DateSpan({self.start.isoformat()}..{self.end.isoformat()})"

    # -- relations --------------------------------------------------------

    def overlaps(self, other: "DateSpan") -> bool:
        """Tell whether the two spans share at least one day."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: "DateSpan") -> Optional["DateSpan"]:
        """The days in both spans, or ``None`` when they share none."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start >= end:
            return None
        return DateSpan(start, end)

    def contains_span(self, other: "DateSpan") -> bool:
        return self.start <= other.start and other.end <= self.end

    # -- splitting --------------------------------------------------------

    def split_by_month(self) -> List["DateSpan"]:
        """Cut the span at month boundaries."""
        parts = []
        start = self.start
        while start < self.end:
            next_month = add_months(start.replace(day=1), 1)
            end = min(next_month, self.end)
            parts.append(DateSpan(start, end))
            start = end
        return parts


def merge_spans(spans: Iterable[DateSpan]) -> List[DateSpan]:
    """Merge overlapping or touching spans; the result is sorted and disjoint.

    Empty spans are dropped.
    """
    merged: List[DateSpan] = []
    for span in sorted((s for s in spans if s), key=lambda s: (s.start, s.end)):
        if merged and span.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = DateSpan(last.start, max(last.end, span.end))
        else:
            merged.append(span)
    return merged

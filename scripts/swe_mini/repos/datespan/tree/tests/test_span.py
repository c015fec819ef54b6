from datetime import date

import pytest

from datespan import DateSpan, merge_spans


def span(a, b):
    return DateSpan(date.fromisoformat(a), date.fromisoformat(b))


def test_length_and_membership():
    s = span("2024-01-01", "2024-01-11")
    assert len(s) == 10
    assert date(2024, 1, 1) in s
    assert date(2024, 1, 10) in s
    assert date(2024, 1, 11) not in s


def test_empty_span():
    s = span("2024-01-01", "2024-01-01")
    assert len(s) == 0
    assert not s
    assert list(s) == []


def test_end_before_start_rejected():
    with pytest.raises(ValueError):
        span("2024-01-02", "2024-01-01")


def test_from_month():
    assert len(DateSpan.from_month(2024, 2)) == 29
    assert DateSpan.from_month(2023, 12) == span("2023-12-01", "2024-01-01")


def test_overlapping_spans():
    assert span("2024-01-01", "2024-01-10").overlaps(span("2024-01-05", "2024-01-20"))
    assert span("2024-01-05", "2024-01-20").overlaps(span("2024-01-01", "2024-01-10"))


def test_disjoint_spans():
    assert not span("2024-01-01", "2024-01-05").overlaps(span("2024-02-01", "2024-02-05"))


def test_intersection():
    a = span("2024-01-01", "2024-01-10")
    assert a.intersection(span("2024-01-05", "2024-01-20")) == span("2024-01-05", "2024-01-10")
    assert a.intersection(span("2024-01-10", "2024-01-20")) is None


def test_split_by_month():
    parts = span("2024-01-15", "2024-03-10").split_by_month()
    assert parts == [
        span("2024-01-15", "2024-02-01"),
        span("2024-02-01", "2024-03-01"),
        span("2024-03-01", "2024-03-10"),
    ]


def test_merge_spans():
    merged = merge_spans([
        span("2024-03-01", "2024-03-05"),
        span("2024-01-01", "2024-01-10"),
        span("2024-01-10", "2024-01-15"),
        span("2024-01-12", "2024-01-13"),
        span("2024-05-01", "2024-05-01"),
    ])
    assert merged == [span("2024-01-01", "2024-01-15"), span("2024-03-01", "2024-03-05")]

from datetime import date, datetime, timedelta, timezone

import pytest

from datespan import DateSpan, parse_date, parse_span, parse_timestamp


def test_parse_date():
    assert parse_date("2024-02-29") == date(2024, 2, 29)
    assert parse_date(" 2023-12-31 ") == date(2023, 12, 31)


def test_parse_date_rejects():
    for text in ["2024-2-1", "20240201", "2024-02-30", "yesterday"]:
        with pytest.raises(ValueError):
            parse_date(text)


def test_parse_span_range():
    assert parse_span("2024-01-01..2024-02-01") == DateSpan(date(2024, 1, 1), date(2024, 2, 1))


def test_parse_span_month():
    assert parse_span("2023-02") == DateSpan(date(2023, 2, 1), date(2023, 3, 1))


def test_parse_naive_timestamp():
    assert parse_timestamp("2024-03-01T10:20:30") == datetime(2024, 3, 1, 10, 20, 30)
    assert parse_timestamp("2024-03-01 10:20") == datetime(2024, 3, 1, 10, 20)


def test_parse_fraction():
    assert parse_timestamp("2024-03-01T10:20:30.25").microsecond == 250000


def test_parse_utc():
    ts = parse_timestamp("2024-03-01T10:00:00Z")
    assert ts.utcoffset() == timedelta(0)


def test_parse_positive_offsets():
    assert parse_timestamp("2024-03-01T10:00:00+05:30").utcoffset() == timedelta(hours=5, minutes=30)
    assert parse_timestamp("2024-03-01T10:00:00+0545").utcoffset() == timedelta(hours=5, minutes=45)
    assert parse_timestamp("2024-03-01T10:00:00+02").utcoffset() == timedelta(hours=2)


def test_parse_negative_whole_hour_offset():
    ts = parse_timestamp("2024-03-01T10:00:00-05:00")
    assert ts.astimezone(timezone.utc) == datetime(2024, 3, 1, 15, 0, tzinfo=timezone.utc)


def test_default_tz():
    ts = parse_timestamp("2024-03-01T10:00", default_tz=timezone.utc)
    assert ts.tzinfo is timezone.utc


def test_bad_offset():
    with pytest.raises(ValueError):
        parse_timestamp("2024-03-01T10:00:00+25:00")

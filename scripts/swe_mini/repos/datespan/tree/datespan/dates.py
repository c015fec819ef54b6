"""Month and business-day arithmetic on :class:`datetime.date`."""

from __future__ import annotations

from datetime import date, timedelta

_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year: int) -> bool:
    """Tell whether *year* has a February 29th (proleptic Gregorian calendar)."""
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    """Number of days in *month* (1-12) of *year*."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, not {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def add_months(day: date, months: int) -> date:
    """Move *day* by a whole number of months.

    When the target month is shorter, the result is clamped to its last day:
    ``add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)``.
    """
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    if not 1 <= year <= 9999:
        raise OverflowError("date value out of range")
    return date(year, month, min(day.day, days_in_month(year, month)))


def month_start(day: date) -> date:
    """First day of the month of *day*."""
    return day.replace(day=1)


def month_end(day: date) -> date:
    """Last day of the month of *day*."""
    return day.replace(day=days_in_month(day.year, day.month))


def is_business_day(day: date) -> bool:
    """Monday to Friday (holidays are not considered)."""
    return day.weekday() < 5


def add_business_days(day: date, count: int) -> date:
    """Move *day* by *count* business days (negative counts move backwards).

    Starting on a weekend with ``count == 0`` returns *day* unchanged.
    """
    step = 1 if count >= 0 else -1
    remaining = abs(count)
    while remaining:
        day += timedelta(days=step)
        if is_business_day(day):
            remaining -= 1
    return day


def business_days_between(start: date, end: date) -> int:
    """Number of business days in the half-open range ``[start, end)``."""
    if end <= start:
        return 0
    days = (end - start).days
    weeks, extra = divmod(days, 7)
    count = weeks * 5
    for offset in range(extra):
        if is_business_day(start + timedelta(days=weeks * 7 + offset)):
            count += 1
    return count

from datetime import date

import pytest

from datespan import (
    add_business_days,
    add_months,
    business_days_between,
    days_in_month,
    is_leap_year,
    month_end,
    month_start,
)


def test_leap_years():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29


def test_days_in_month_rejects_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2024, 13)


def test_add_months_simple():
    assert add_months(date(2024, 3, 15), 2) == date(2024, 5, 15)
    assert add_months(date(2024, 3, 15), -3) == date(2023, 12, 15)


def test_add_months_clamps_to_month_end():
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2024, 5, 31), -1) == date(2024, 4, 30)


def test_add_months_across_years():
    assert add_months(date(2023, 11, 30), 14) == date(2025, 1, 30)


def test_month_start_and_end():
    assert month_start(date(2024, 2, 17)) == date(2024, 2, 1)
    assert month_end(date(2024, 2, 17)) == date(2024, 2, 29)
    assert month_end(date(2023, 12, 5)) == date(2023, 12, 31)


def test_add_business_days():
    friday = date(2024, 3, 1)
    assert add_business_days(friday, 1) == date(2024, 3, 4)
    assert add_business_days(friday, 5) == date(2024, 3, 8)
    assert add_business_days(date(2024, 3, 4), -1) == friday


def test_business_days_between():
    assert business_days_between(date(2024, 3, 1), date(2024, 3, 8)) == 5
    assert business_days_between(date(2024, 3, 2), date(2024, 3, 4)) == 0
    assert business_days_between(date(2024, 3, 1), date(2024, 4, 1)) == 21
    assert business_days_between(date(2024, 3, 8), date(2024, 3, 1)) == 0

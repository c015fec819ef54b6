"""datespan: month arithmetic and business days for datetime.date."""

from .dates import (
    add_business_days,
    add_months,
    business_days_between,
    days_in_month,
    is_leap_year,
    month_end,
    month_start,
)

__version__ = "0.1.0"

__all__ = [
    "add_business_days",
    "add_months",
    "business_days_between",
    "days_in_month",
    "is_leap_year",
    "month_end",
    "month_start",
]

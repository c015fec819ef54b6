"""datespan: date spans, month arithmetic and strict ISO 8601 parsing."""

from .dates import (
    add_business_days,
    add_months,
    business_days_between,
    days_in_month,
    is_leap_year,
    month_end,
    month_start,
)
from .parse import parse_date, parse_span, parse_timestamp
from .span import DateSpan, merge_spans

__version__ = "0.2.0"

__all__ = [
    "DateSpan",
    "add_business_days",
    "add_months",
    "business_days_between",
    "days_in_month",
    "is_leap_year",
    "merge_spans",
    "month_end",
    "month_start",
    "parse_date",
    "parse_span",
    "parse_timestamp",
]

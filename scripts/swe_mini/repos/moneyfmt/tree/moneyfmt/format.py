"""Formatting amounts for display."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Union

from .currency import DEFAULT_MINOR_UNITS
from .money import Money


def format_number(
    value: Union[int, str, Decimal],
    places: int = 2,
    *,
    group_sep: str = ",",
    decimal_sep: str = ".",
) -> str:
    """Format *value* with *places* decimals (rounded half-up) and digit grouping.

    >>> format_number(Decimal("1234567.891"))
    '1,234,567.89'
    """
    quantized = Decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    if quantized.is_zero():
        quantized = quantized.copy_abs()  # no "-0.00"
    integer, _, fraction = f"{quantized:f}".partition(".")
    if group_sep:
        integer = _group(integer, group_sep)
    return integer + (decimal_sep + fraction if fraction else "")


def _group(digits: str, sep: str) -> str:
    groups = []
    while len(digits) > 3:
        groups.append(digits[-3:])
        digits = digits[:-3]
    groups.append(digits)
    return sep.join(reversed(groups))


def format_money(
    money: Money,
    *,
    symbol: bool = True,
    code: bool = False,
    group_sep: str = ",",
    decimal_sep: str = ".",
) -> str:
    """Format *money* for display, e.g. ``$1,234.50`` or ``-€3.00``.

    :param symbol: prefix the currency symbol (alphabetic symbols such as
        ``CHF`` are followed by a space).
    :param code: append the ISO code (``1,234.50 USD``).
    """
    currency = money.currency
    places = currency.minor_units or DEFAULT_MINOR_UNITS
    number = format_number(money.amount, places, group_sep=group_sep, decimal_sep=decimal_sep)
    sign = ""
    if number.startswith("-"):
        sign, number = "-", number[1:]
    prefix = ""
    if symbol:
        prefix = currency.symbol + (" " if currency.symbol[-1:].isalpha() else "")
    text = f"{sign}{prefix}{number}"
    if code:
        text += f" {currency.code}"
    return text

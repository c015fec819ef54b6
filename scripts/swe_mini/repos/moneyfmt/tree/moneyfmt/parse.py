"""Parsing formatted amounts back into :class:`Money`."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional, Union

from .currency import Currency, currency_for_symbol, get_currency
from .money import Money

_CODE_SUFFIX = re.compile(r"\s+([A-Za-z]{3})$")


def parse_money(
    text: str,
    currency: Union[str, Currency, None] = None,
    *,
    group_sep: str = ",",
    decimal_sep: str = ".",
) -> Money:
    """Parse ``$1,234.50``, ``-€3``, ``(12.00)`` or ``1,234.50 USD``.

    The currency comes from a trailing ISO code, a leading symbol, or the
    *currency* argument, in that order. Parentheses mean a negative amount.
    """
    rest = text.strip()
    found: Optional[Currency] = None
    m = _CODE_SUFFIX.search(rest)
    if m:
        found = get_currency(m.group(1))
        rest = rest[: m.start()].strip()

    negative = False
    if rest.startswith("(") and rest.endswith(")"):
        negative, rest = True, rest[1:-1].strip()
    if rest.startswith("-"):
        negative, rest = not negative, rest[1:].strip()

    symbol_match = re.match(r"[^\d\s.,]+", rest)
    if symbol_match:
        symbol = symbol_match.group(0)
        by_symbol = currency_for_symbol(symbol)
        if by_symbol is None:
            raise ValueError(f"unknown currency symbol {symbol!r} in {text!r}")
        found = found or by_symbol
        rest = rest[symbol_match.end() :].strip()

    if found is None:
        if currency is None:
            raise ValueError(f"no currency in {text!r} and none given")
        found = currency if isinstance(currency, Currency) else get_currency(currency)

    number = rest.replace(group_sep, "") if group_sep else rest
    if decimal_sep != ".":
        number = number.replace(decimal_sep, ".")
    try:
        amount = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not an amount: {text!r}") from None
    return Money(-amount if negative else amount, found)

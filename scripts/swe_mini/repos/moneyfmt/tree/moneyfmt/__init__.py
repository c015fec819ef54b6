"""moneyfmt: Decimal-based money values, allocation, formatting and parsing."""

from .currency import Currency, UnknownCurrencyError, get_currency, register_currency
from .format import format_money, format_number
from .money import CurrencyMismatchError, Money
from .parse import parse_money

__version__ = "0.4.2"

__all__ = [
    "Currency",
    "CurrencyMismatchError",
    "Money",
    "UnknownCurrencyError",
    "format_money",
    "format_number",
    "get_currency",
    "parse_money",
    "register_currency",
]

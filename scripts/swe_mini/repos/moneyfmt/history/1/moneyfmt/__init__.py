"""moneyfmt: Decimal-based money values."""

from .currency import Currency, UnknownCurrencyError, get_currency, register_currency
from .money import CurrencyMismatchError, Money

__version__ = "0.3.0"

__all__ = [
    "Currency",
    "CurrencyMismatchError",
    "Money",
    "UnknownCurrencyError",
    "get_currency",
    "register_currency",
]

"""Currency definitions."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Dict, Optional

#: Minor units assumed for a currency registered without them.
DEFAULT_MINOR_UNITS = 2


class UnknownCurrencyError(ValueError):
    """No currency is registered under this code."""


@dataclass(frozen=True)
class Currency:
    """An ISO 4217 currency.

    ``minor_units`` is the number of decimal places used for amounts (2 for
    cents); ``None`` means unknown, in which case two places are used.
    """

    code: str
    symbol: str
    minor_units: Optional[int] = DEFAULT_MINOR_UNITS
    name: str = ""

    @property
    def places(self) -> int:
        return DEFAULT_MINOR_UNITS if self.minor_units is None else self.minor_units

    @property
    def quantum(self) -> Decimal:
        """The smallest amount: ``Decimal('0.01')`` for two minor units."""
        return Decimal(1).scaleb(-self.places)


_REGISTRY: Dict[str, Currency] = {}


def register_currency(currency: Currency) -> Currency:
    """Add (or replace) a currency in the registry."""
    _REGISTRY[currency.code.upper()] = currency
    return currency


def get_currency(code: str) -> Currency:
    """Look a currency up by its ISO code (case-insensitive)."""
    try:
        return _REGISTRY[code.upper()]
    except KeyError:
        raise UnknownCurrencyError(f"unknown currency: {code!r}") from None


def currency_for_symbol(symbol: str) -> Optional[Currency]:
    """The first registered currency using *symbol*, if any."""
    for currency in _REGISTRY.values():
        if currency.symbol == symbol:
            return currency
    return None


for _currency in (
    Currency("USD", "$", 2, "US Dollar"),
    Currency("EUR", "€", 2, "Euro"),
    Currency("GBP", "£", 2, "Pound Sterling"),
    Currency("JPY", "¥", 0, "Yen"),
    Currency("CHF", "CHF", 2, "Swiss Franc"),
    Currency("SEK", "kr", 2, "Swedish Krona"),
    Currency("INR", "₹", 2, "Indian Rupee"),
    Currency("KWD", "KD", 3, "Kuwaiti Dinar"),
):
    register_currency(_currency)

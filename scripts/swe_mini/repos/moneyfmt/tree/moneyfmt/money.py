"""The :class:`Money` value type."""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import Iterable, List, Union

from .currency import Currency, get_currency

Number = Union[int, str, Decimal]


class CurrencyMismatchError(TypeError):
    """An operation mixed two different currencies."""


class Money:
    """An amount of a currency. Immutable; compare and add only within one currency."""

    __slots__ = ("_amount", "_currency")

    def __init__(self, amount: Number, currency: Union[str, Currency]) -> None:
        if isinstance(amount, float):
            raise TypeError("floats are not accepted; pass a str, int or Decimal")
        if isinstance(amount, bool) or not isinstance(amount, (int, str, Decimal)):
            raise TypeError(f"bad amount: {amount!r}")
        self._amount = Decimal(amount)
        if not self._amount.is_finite():
            raise ValueError(f"amount must be finite: {amount!r}")
        self._currency = currency if isinstance(currency, Currency) else get_currency(currency)

    @property
    def amount(self) -> Decimal:
        return self._amount

    @property
    def currency(self) -> Currency:
        return self._currency

    @classmethod
    def zero(cls, currency: Union[str, Currency]) -> "Money":
        return cls(0, currency)

    # -- arithmetic -------------------------------------------------------

    def _check(self, other: object) -> "Money":
        if not isinstance(other, Money):
            raise TypeError(f"expected Money, got {type(other).__name__}")
        if other.currency.code != self.currency.code:
            raise CurrencyMismatchError(f"{self.currency.code} vs {other.currency.code}")
        return other

    def __add__(self, other: "Money") -> "Money":
        return Money(self.amount + self._check(other).amount, self.currency)

    def __sub__(self, other: "Money") -> "Money":
        return Money(self.amount - self._check(other).amount, self.currency)

    def __neg__(self) -> "Money":
        return Money(-self.amount, self.currency)

    def __abs__(self) -> "Money":
        return Money(abs(self.amount), self.currency)

    def __mul__(self, factor: Union[int, Decimal]) -> "Money":
        if isinstance(factor, (float, bool)) or not isinstance(factor, (int, Decimal)):
            return NotImplemented
        return Money(self.amount * factor, self.currency)

    __rmul__ = __mul__

    # -- comparison -------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Money):
            return NotImplemented
        return self.currency.code == other.currency.code and self.amount == other.amount

    def __lt__(self, other: "Money") -> bool:
        return self.amount < self._check(other).amount

    def __le__(self, other: "Money") -> bool:
        return self.amount <= self._check(other).amount

    def __hash__(self) -> int:
        return hash((self.amount, self.currency.code))

    def __bool__(self) -> bool:
        return bool(self.amount)

    # -- rounding and allocation ------------------------------------------

    def rounded(self) -> "Money":
        """Round half-up to the currency's minor unit."""
        return Money(self.amount.quantize(self.currency.quantum, rounding=ROUND_HALF_UP), self.currency)

    def allocate(self, ratios: Iterable[Number]) -> List["Money"]:
        """Split the (rounded) amount in proportion to *ratios*.

        Every part is a whole number of minor units and the parts add up to
        exactly the rounded amount; leftover minor units go to the first parts.

        >>> [str(m) for m in Money("10", "USD").allocate([1, 1, 1])]
        ['$3.34', '$3.33', '$3.33']
        """
        weights = [Decimal(r) for r in ratios]
        if not weights:
            raise ValueError("at least one ratio is required")
        if any(w < 0 for w in weights) or sum(weights) == 0:
            raise ValueError("ratios must be non-negative and not all zero")
        quantum = self.currency.quantum
        total = self.rounded().amount
        total_weight = sum(weights)
        shares = [(total * w / total_weight).quantize(quantum, rounding=ROUND_DOWN) for w in weights]
        remainder = total - sum(shares)
        receivers = [i for i, w in enumerate(weights) if w]
        i = 0
        while remainder > 0:
            shares[receivers[i % len(receivers)]] += quantum
            remainder -= quantum
            i += 1
        return [Money(share, self.currency) for share in shares]

    def split(self, parts: int) -> List["Money"]:
        """Split into *parts* near-equal parts (see :meth:`allocate`)."""
        if parts < 1:
            raise ValueError("parts must be >= 1")
        return self.allocate([1] * parts)

    # -- display ----------------------------------------------------------

    def __repr__(self) -> str:
        return f"Money({str(self.amount)!r}, {self.currency.code!r})"

    def __str__(self) -> str:
        from .format import format_money

        return format_money(self)

from decimal import Decimal

import pytest

from moneyfmt import CurrencyMismatchError, Money, UnknownCurrencyError


def test_construction():
    m = Money("12.50", "usd")
    assert m.amount == Decimal("12.50")
    assert m.currency.code == "USD"


def test_floats_rejected():
    with pytest.raises(TypeError):
        Money(0.1, "USD")


def test_unknown_currency():
    with pytest.raises(UnknownCurrencyError):
        Money(1, "XXX")


def test_arithmetic():
    a, b = Money("10.25", "EUR"), Money("0.75", "EUR")
    assert a + b == Money("11", "EUR")
    assert a - b == Money("9.50", "EUR")
    assert -a == Money("-10.25", "EUR")
    assert a * 2 == 2 * a == Money("20.50", "EUR")


def test_currency_mismatch():
    with pytest.raises(CurrencyMismatchError):
        Money(1, "USD") + Money(1, "EUR")
    assert Money(1, "USD") != Money(1, "EUR")


def test_ordering():
    assert Money("1.00", "USD") < Money("1.01", "USD")
    assert sorted([Money(3, "USD"), Money(1, "USD")]) == [Money(1, "USD"), Money(3, "USD")]


def test_rounded_half_up():
    assert Money("2.675", "USD").rounded() == Money("2.68", "USD")
    assert Money("1500.5", "JPY").rounded() == Money("1501", "JPY")
    assert Money("1.0005", "KWD").rounded() == Money("1.001", "KWD")


def test_allocate_even_split():
    assert Money("100", "USD").split(3) == [Money("33.34", "USD"), Money("33.33", "USD"), Money("33.33", "USD")]


def test_allocate_by_ratio():
    parts = Money("0.05", "USD").allocate([3, 7])
    assert parts == [Money("0.02", "USD"), Money("0.03", "USD")]


def test_allocate_zero_ratio_gets_nothing():
    parts = Money("10", "USD").allocate([1, 0, 2])
    assert parts == [Money("3.34", "USD"), Money("0", "USD"), Money("6.66", "USD")]


def test_allocate_jpy_whole_units():
    assert Money("1000", "JPY").split(3) == [Money(334, "JPY"), Money(333, "JPY"), Money(333, "JPY")]


def test_allocate_rejects_bad_ratios():
    with pytest.raises(ValueError):
        Money(1, "USD").allocate([])
    with pytest.raises(ValueError):
        Money(1, "USD").allocate([0, 0])

from decimal import Decimal

import pytest

from moneyfmt import Money, parse_money


def test_parse_with_symbol():
    assert parse_money("$1,234.50") == Money("1234.50", "USD")


def test_parse_with_code():
    assert parse_money("1,234.50 EUR") == Money("1234.50", "EUR")


def test_parse_negative_forms():
    assert parse_money("-$5.00") == Money("-5", "USD")
    assert parse_money("($12.00)") == Money("-12", "USD")


def test_parse_default_currency():
    assert parse_money("42", "GBP") == Money("42", "GBP")
    with pytest.raises(ValueError):
        parse_money("42")


def test_parse_european_separators():
    m = parse_money("1.234,56 EUR", group_sep=".", decimal_sep=",")
    assert m.amount == Decimal("1234.56")


def test_parse_garbage():
    with pytest.raises(ValueError):
        parse_money("$12.3.4")

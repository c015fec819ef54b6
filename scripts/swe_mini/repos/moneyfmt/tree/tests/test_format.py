from decimal import Decimal

from moneyfmt import Money, format_money, format_number


def test_format_number_grouping():
    assert format_number(Decimal("1234567.891")) == "1,234,567.89"
    assert format_number(Decimal("999.999")) == "1,000.00"
    assert format_number(Decimal("12")) == "12.00"


def test_format_number_no_places():
    assert format_number(Decimal("1234.5"), 0) == "1,235"


def test_format_number_separators():
    assert format_number(Decimal("1234567.5"), group_sep=".", decimal_sep=",") == "1.234.567,50"
    assert format_number(Decimal("1234567.5"), group_sep="") == "1234567.50"


def test_format_number_no_negative_zero():
    assert format_number(Decimal("-0.001")) == "0.00"


def test_format_money_basic():
    assert format_money(Money("1234.5", "USD")) == "$1,234.50"
    assert format_money(Money("0.5", "GBP")) == "£0.50"


def test_format_money_negative():
    assert format_money(Money("-1234.5", "EUR")) == "-€1,234.50"
    assert format_money(Money("-5", "USD")) == "-$5.00"


def test_format_money_alphabetic_symbol():
    assert format_money(Money("10", "CHF")) == "CHF 10.00"


def test_format_money_code_without_symbol():
    assert format_money(Money("1234.5", "USD"), symbol=False, code=True) == "1,234.50 USD"


def test_format_money_three_decimals():
    assert format_money(Money("1.2345", "KWD")) == "KD 1.235"


def test_str_uses_format_money():
    assert str(Money("7", "USD")) == "$7.00"

import pytest

from tablefmt import Table, render

FRUIT = Table(["fruit", "qty", "price"], [["apple", 3, 0.5], ["cherry", 120, 12.25]])


def test_plain():
    assert FRUIT.render() == (
        "fruit   qty  price\n"
        "------  ---  -----\n"
        "apple     3    0.5\n"
        "cherry  120  12.25"
    )


def test_markdown():
    assert FRUIT.render("markdown") == (
        "| fruit  | qty | price |\n"
        "|:-------|----:|------:|\n"
        "| apple  |   3 |   0.5 |\n"
        "| cherry | 120 | 12.25 |"
    )


def test_grid():
    assert render(["a", "b"], [["x", 1]], style="grid") == (
        "+---+---+\n"
        "| a | b |\n"
        "+===+===+\n"
        "| x | 1 |\n"
        "+---+---+"
    )


def test_grid_without_rows():
    assert render(["a"], [], style="grid") == "+---+\n| a |\n+===+"


def test_explicit_alignment():
    out = render(["n", "word"], [[1, "hi"], [22, "hello"]], align=["left", "center"])
    assert out.splitlines()[2:] == ["1    hi", "22  hello"]


def test_mixed_column_is_left_aligned():
    out = render(["v"], [["10"], ["n/a"]])
    assert out.splitlines()[2:] == ["10", "n/a"]


def test_numbers_with_thousands_separators_are_right_aligned():
    out = render(["amount"], [["1,200"], ["35"]])
    assert out.splitlines()[2:] == [" 1,200", "    35"]


def test_none_is_empty_and_ignored_for_alignment():
    out = render(["n"], [[None], [5], [12]])
    assert out.splitlines()[2:] == ["", " 5", "12"]


def test_unknown_style():
    with pytest.raises(ValueError, match="unknown style"):
        FRUIT.render("html")


def test_ragged_row_rejected():
    with pytest.raises(ValueError):
        render(["a", "b"], [["only one"]])


def test_multiline_cells_flattened():
    assert render(["a"], [["x\ny"]]).splitlines()[2] == "x y"

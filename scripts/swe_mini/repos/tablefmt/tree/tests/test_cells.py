from tablefmt import display_width, is_number
from tablefmt.cells import cell_text, pad


def test_display_width_ascii():
    assert display_width("hello") == 5


def test_display_width_wide_characters():
    assert display_width("日本語") == 6
    assert display_width("ＡＢ") == 4


def test_display_width_combining_marks():
    assert display_width("e\u0301") == 1


def test_is_number():
    assert is_number("12")
    assert is_number("3.25")
    assert is_number(" 1,200 ")
    assert not is_number("1.2.3")
    assert not is_number("")
    assert not is_number("abc")


def test_pad():
    assert pad("ab", 5) == "ab   "
    assert pad("ab", 5, "right") == "   ab"
    assert pad("ab", 5, "center") == " ab  "
    assert pad("日本", 6) == "日本  "


def test_cell_text():
    assert cell_text(None) == ""
    assert cell_text(1.5) == "1.5"
    assert cell_text("a\r\nb") == "a b"

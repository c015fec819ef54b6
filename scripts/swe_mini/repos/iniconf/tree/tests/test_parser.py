import pytest

from iniconf import ParseError
from iniconf.parser import parse


def test_sections_and_options():
    data = parse("[a]\nx = 1\ny: two\n\n[b]\nz=3\n")
    assert data == {"a": {"x": "1", "y": "two"}, "b": {"z": "3"}}


def test_keys_are_lowercased_sections_are_not():
    data = parse("[Server]\nHost = example.org\n")
    assert data == {"Server": {"host": "example.org"}}


def test_full_line_comments():
    data = parse("# top\n[a]\n; note\nx = 1\n  # indented comment\n")
    assert data == {"a": {"x": "1"}}


def test_inline_comments():
    data = parse("[a]\nport = 8080 ; the port\nname = web # web server\n")
    assert data["a"] == {"port": "8080", "name": "web"}


def test_hash_without_space_is_part_of_value():
    assert parse("[a]\ntag = c#\nurl = http://x/#top\n")["a"] == {
        "tag": "c#",
        "url": "http://x/#top",
    }


def test_quoted_values_keep_spaces_and_escapes():
    data = parse('[a]\npad = "  x  "\nmsg = "say \\"hi\\"\\n"\n')
    assert data["a"] == {"pad": "  x  ", "msg": 'say "hi"\n'}


def test_continuation_lines():
    data = parse("[a]\nhosts = one\n  two\n  three\nafter = 1\n")
    assert data["a"] == {"hosts": "one\ntwo\nthree", "after": "1"}


def test_empty_value():
    assert parse("[a]\nx =\n")["a"] == {"x": ""}


def test_duplicate_key_is_an_error_with_line_number():
    with pytest.raises(ParseError) as exc:
        parse("[a]\nx = 1\nX = 2\n")
    assert exc.value.lineno == 3


def test_option_outside_section():
    with pytest.raises(ParseError, match="outside of any section"):
        parse("x = 1\n")


def test_unterminated_quote():
    with pytest.raises(ParseError, match="unterminated"):
        parse('[a]\nx = "abc\n')

from slugkit import slugify, transliterate
from slugkit.translit import is_ascii


def test_plain_ascii_unchanged():
    assert transliterate("Hello, World 123") == "Hello, World 123"


def test_special_letters():
    assert transliterate("Straße") == "Strasse"
    assert transliterate("Œuvre") == "OEuvre"
    assert transliterate("Łódź")[:1] == "L"


def test_ligatures_are_folded():
    assert transliterate("ﬁnance ﬂow") == "finance flow"


def test_unknown_characters_use_replacement():
    assert transliterate("東京", replacement="?") == "??"
    assert transliterate("東京") == ""


def test_is_ascii():
    assert is_ascii("abc")
    assert not is_ascii("abç")


def test_slugify_special_letters():
    assert slugify("Große Straße") == "grosse-strasse"

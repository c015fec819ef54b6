import pytest

from slugkit import Slugger, slugify


def test_basic_slug():
    assert slugify("Hello, World!") == "hello-world"


def test_collapses_punctuation_and_whitespace():
    assert slugify("  a -- b\t\tc...  ") == "a-b-c"


def test_custom_separator():
    assert slugify("Hello big World", separator="_") == "hello_big_world"


def test_keep_case():
    assert slugify("Hello World", lowercase=False) == "Hello-World"


def test_stopwords_are_case_insensitive():
    assert slugify("The Art of the Deal", stopwords=["the", "OF"]) == "art-deal"


def test_max_length_short_text_untouched():
    assert slugify("short", max_length=50) == "short"


def test_max_length_word_boundary():
    assert slugify("The quick brown fox", max_length=12, word_boundary=True) == "the-quick"


def test_max_length_word_boundary_long_first_word():
    assert slugify("Supercalifragilistic", max_length=5, word_boundary=True) == "super"


def test_negative_max_length_rejected():
    with pytest.raises(ValueError):
        slugify("abc", max_length=-1)


def test_empty_input():
    assert slugify("") == ""
    assert slugify("!!!") == ""


def test_slugger_numbers_duplicates():
    s = Slugger()
    assert [s.slug("Intro"), s.slug("Intro"), s.slug("intro")] == ["intro", "intro-2", "intro-3"]


def test_slugger_avoids_collision_with_numbered_text():
    s = Slugger()
    assert s.slug("Intro 2") == "intro-2"
    assert s.slug("Intro") == "intro"
    assert s.slug("Intro") == "intro-3"


def test_slugger_fallback_and_reset():
    s = Slugger(fallback="untitled")
    assert s.slug("???") == "untitled"
    assert "untitled" in s
    s.reset()
    assert "untitled" not in s

from slugkit import split_words, to_camel_case, to_kebab_case, to_pascal_case, to_snake_case


def test_split_on_separators():
    assert split_words("user_id, created-at") == ["user", "id", "created", "at"]


def test_split_camel_case():
    assert split_words("createdAt") == ["created", "At"]


def test_snake_from_camel():
    assert to_snake_case("helloWorld") == "hello_world"


def test_snake_from_pascal():
    assert to_snake_case("HelloWorld") == "hello_world"


def test_snake_is_idempotent():
    assert to_snake_case("already_snake_case") == "already_snake_case"


def test_digits_stay_with_word():
    assert to_snake_case("Version2Beta") == "version2_beta"


def test_kebab():
    assert to_kebab_case("Hello big World") == "hello-big-world"


def test_camel_and_pascal():
    assert to_camel_case("foo_bar_baz") == "fooBarBaz"
    assert to_pascal_case("foo bar") == "FooBar"


def test_non_ascii_letters():
    assert to_snake_case("ÜberCool") == "über_cool"


def test_empty_string():
    assert to_snake_case("") == ""
    assert to_camel_case("") == ""

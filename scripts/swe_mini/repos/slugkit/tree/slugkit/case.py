"""Conversions between identifier styles (snake_case, camelCase, ...)."""

from __future__ import annotations

import re

# Anything that is not a letter or a digit separates words.
_SEPARATORS = re.compile(r"[\W_]+")


def split_words(text: str) -> list[str]:
    """Split *text* into words.

    Words are separated by any run of non-alphanumeric characters, and by case
    changes inside a run (``"fooBar"`` -> ``["foo", "Bar"]``). Digits stay
    attached to the word they follow.

    >>> split_words("user_id, createdAt")
    ['user', 'id', 'created', 'At']
    """
    words: list[str] = []
    for chunk in _SEPARATORS.split(text):
        if chunk:
            words.extend(_split_case(chunk))
    return words


def _split_case(chunk: str) -> list[str]:
    words = []
    start = 0
    for i in range(1, len(chunk)):
        if chunk[i].isupper():
            words.append(chunk[start:i])
            start = i
    words.append(chunk[start:])
    return words


def to_snake_case(text: str) -> str:
    """``"Hello World"`` -> ``"hello_world"``."""
    return "_".join(word.lower() for word in split_words(text))


def to_kebab_case(text: str) -> str:
    """``"Hello World"`` -> ``"hello-world"``."""
    return "-".join(word.lower() for word in split_words(text))


def to_pascal_case(text: str) -> str:
    """``"hello world"`` -> ``"HelloWorld"``."""
    return "".join(word[:1].upper() + word[1:].lower() for word in split_words(text))


def to_camel_case(text: str) -> str:
    """``"hello world"`` -> ``"helloWorld"``."""
    pascal = to_pascal_case(text)
    return pascal[:1].lower() + pascal[1:]

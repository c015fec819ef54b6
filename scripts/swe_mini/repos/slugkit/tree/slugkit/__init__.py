"""slugkit: URL slugs, identifier case conversion and ASCII transliteration."""

from .case import split_words, to_camel_case, to_kebab_case, to_pascal_case, to_snake_case
from .slugify import Slugger, slugify
from .translit import transliterate

__version__ = "0.3.0"

__all__ = [
    "Slugger",
    "slugify",
    "split_words",
    "to_camel_case",
    "to_kebab_case",
    "to_pascal_case",
    "to_snake_case",
    "transliterate",
]

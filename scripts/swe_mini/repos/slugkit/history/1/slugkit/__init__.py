"""slugkit: URL slugs and ASCII transliteration."""

from .slugify import Slugger, slugify
from .translit import transliterate

__version__ = "0.2.0"

__all__ = ["Slugger", "slugify", "transliterate"]

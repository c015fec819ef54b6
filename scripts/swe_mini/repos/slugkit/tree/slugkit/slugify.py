"""URL slugs."""

from __future__ import annotations

import re
from typing import Iterable, Optional

from .translit import transliterate

_WORD = re.compile(r"[A-Za-z0-9]+")


def slugify(
    text: str,
    separator: str = "-",
    *,
    lowercase: bool = True,
    max_length: Optional[int] = None,
    word_boundary: bool = False,
    stopwords: Iterable[str] = (),
) -> str:
    """Turn *text* into a URL slug.

    The text is transliterated to ASCII, split into runs of letters and
    digits, and the words are joined with *separator*.

    :param lowercase: lowercase the slug (default ``True``).
    :param max_length: cut the slug to at most this many characters.
    :param word_boundary: with *max_length*, only cut between whole words
        (falls back to a hard cut when the first word alone is too long).
    :param stopwords: words left out of the slug, compared case-insensitively.

    >>> slugify("Hello, World!")
    'hello-world'
    """
    words = _WORD.findall(transliterate(text, replacement=" "))
    if stopwords:
        stop = {word.lower() for word in stopwords}
        words = [word for word in words if word.lower() not in stop]
    if lowercase:
        words = [word.lower() for word in words]
    if max_length is not None:
        if max_length < 0:
            raise ValueError("max_length must be >= 0")
        return _truncate(words, separator, max_length, word_boundary)
    return separator.join(words)


def _truncate(words: list[str], separator: str, max_length: int, word_boundary: bool) -> str:
    slug = separator.join(words)
    if len(slug) <= max_length:
        return slug
    if word_boundary:
        kept: list[str] = []
        for word in words:
            if len(separator.join(kept + [word])) > max_length:
                break
            kept.append(word)
        if kept:
            return separator.join(kept)
    return slug[:max_length]


class Slugger:
    """Hand out slugs that are unique among those it has produced.

    Useful for heading anchors: the second "Intro" becomes ``intro-2``.

    >>> s = Slugger()
    >>> s.slug("Intro"), s.slug("Intro"), s.slug("Intro")
    ('intro', 'intro-2', 'intro-3')
    """

    def __init__(self, separator: str = "-", *, fallback: str = "section", **options) -> None:
        self.separator = separator
        self.fallback = fallback
        self.options = options
        self._seen: set[str] = set()

    def slug(self, text: str) -> str:
        """Return a slug for *text* that this Slugger has not returned before."""
        base = slugify(text, self.separator, **self.options) or self.fallback
        candidate = base
        n = 1
        while candidate in self._seen:
            n += 1
            candidate = f"{base}{self.separator}{n}"
        self._seen.add(candidate)
        return candidate

    def reset(self) -> None:
        """Forget every slug handed out so far."""
        self._seen.clear()

    def __contains__(self, slug: str) -> bool:
        return slug in self._seen

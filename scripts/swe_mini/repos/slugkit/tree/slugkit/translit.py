"""Best-effort transliteration of Unicode text to ASCII."""

from __future__ import annotations

import unicodedata

#: Letters that Unicode decomposition does not reduce to plain ASCII.
SPECIAL_CASES = {
    "ß": "ss",
    "ẞ": "SS",
    "æ": "ae",
    "Æ": "AE",
    "œ": "oe",
    "Œ": "OE",
    "ø": "o",
    "Ø": "O",
    "ł": "l",
    "Ł": "L",
    "đ": "d",
    "Đ": "D",
    "ð": "d",
    "Ð": "D",
    "þ": "th",
    "Þ": "Th",
    "ı": "i",
}

_TABLE = str.maketrans(SPECIAL_CASES)


def transliterate(text: str, replacement: str = "") -> str:
    """Return an ASCII approximation of *text*.

    Letters with a conventional spelling are replaced first (``ß`` -> ``ss``),
    then compatibility characters such as ligatures are folded and accents
    (combining marks) are dropped from their base letters. Any character that
    still has no ASCII form is replaced by *replacement*.

    >>> transliterate("Straße")
    'Strasse'
    >>> transliterate("東京", replacement="?")
    '??'
    """
    text = unicodedata.normalize("NFKC", text.translate(_TABLE))
    out = []
    for ch in text:
        if ord(ch) < 128:
            out.append(ch)
        elif unicodedata.combining(ch):
            continue
        else:
            out.append(replacement)
    return "".join(out)


def is_ascii(text: str) -> bool:
    """Tell whether *text* consists of ASCII characters only."""
    return all(ord(ch) < 128 for ch in text)

"""STEM answers: extraction from a reply (cheap, in the event loop) and the scoring
function that runs in ``ScoringPool`` workers.

A question is described by a *spec*, a plain dict (it crosses to scoring workers):

- ``{"kind": "choice", "choices": [str, ...], "gold": "C"}``
- ``{"kind": "number", "gold": "3.0e8", "tolerance": 0.01}`` (relative to the gold)
- ``{"kind": "exact", "gold": "carbon dioxide"}`` (case, space, punctuation normalised)
- ``{"kind": "expression", "gold": "\\frac{1}{2} m v^2"}`` (math-verify)

Extraction looks for *explicit* answers only: an answer marker ("Answer: C", "the
answer is (C)", "The correct option is C."), a ``\\boxed{}``, and for choice
questions a bold letter closing its line (``**C**``) and a final line that is a lone
letter or "C) text". The last one that reads as an answer wins. A letter must stand
alone: "A ball" or "I think" never give a choice.

A choice answer whose clause names more than one choice ("A or B", "A/B", "(A) (B)",
"**A** or **B**", "\\boxed{A} \\boxed{B}") is *ambiguous*: ``read_answer`` says so, and it
scores 0. The clause is the answer's line (after the marker, for a marker answer), cut
at a sentence end or an explanation word ("because", "not", "is", ...), or where the
aside holding that word opens, so "B, because A is wrong" and "B (A and C are wrong)"
stay B. Full-width letters and the Cyrillic and Greek capitals that look
like A-J are read as those letters, in the answer and in the hedge alike.

Kept apart from ``handlers/stem/handler.py`` (like ``math.scoring``) so a scoring worker
imports only this and ``handlers.latex``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from rollserve.handlers.latex import extract_boxed, unwrap_latex_text, verify_math_answer

LETTERS = "ABCDEFGHIJ"
KINDS = ("choice", "number", "exact", "expression")
DEFAULT_TOLERANCE = 1e-2
_MAX_LINE = 300  # characters of an answer line read (bounds every regex below)

# "Answer: C", "the answer is (C)", "The correct option is C.", "**Final answer:** C",
# "the best choice would be B": a marker, a separator, then the answer itself.
_MARKER = re.compile(
    r"(?<![A-Za-z])(?:(?:correct|right|best|final)\s+(?:answer|option|choice)|answer)"
    r"[ \t*_]*"
    r"(?:(?:is|would\s+be|should\s+be|must\s+be|will\s+be)\b(?:[ \t*_]*:)?|[:=\-–—])"
    r"[ \t*_]*(?:(?:therefore|thus|clearly|probably|likely|then|indeed)\b[ \t,]*)?"
    r"(?:\n[ \t*_>#]*)?",
    re.IGNORECASE,
)
# A bold letter ending its line: "So I pick **C**." / "**(B) 2 m**"
_BOLD = re.compile(r"\*\*[ \t]*([^*\n]{1,80}?)[ \t]*\*\*(?=[ \t.,;:!)]*(?:\n|$))")
# A letter at the start of an answer: "C", "(C)", "C)", "C.", "C: Paris", "[c]"
_LEAD_LETTER = re.compile(r"([(\[]?)([A-Ja-j])([)\]]?)(?![A-Za-z0-9]|\.[A-Za-z0-9])")
_TRAILING_LETTER = re.compile(r"\(([A-Ja-j])\)$")  # "Paris (C)"
# Words after which a bare "A"/"I" is still a choice ("A because ...").
_CONNECTORS = frozenset({"because", "since", "as", "which", "given", "due", "and", "or", "is", "was"})
_FINAL_LINE_LETTER = re.compile(r"[(\[]?([A-Ja-j])(?:[)\]]?[.:]?|[)\]]\s+\S.*|\.\s+\S.*)")
_MARKUP = " \t*_`$>#"

# --- hedges ------------------------------------------------------------------------
# Look-alikes of A-J read as those letters (after NFKC, which folds full-width "Ａ"):
# Cyrillic А В С Е І Ј а с е і ј and Greek Α Β Ε Ι.
_LOOKALIKES = str.maketrans("АВСЕІЈасеіјΑΒΕΙ", "ABCEIJaceijABEI")
# Any letter standing alone, bracketed or not: "B", "(b)", "[C]", "D)".
_LETTER_TOKEN = re.compile(r"(?<![\w'’\\])([(\[]?)([A-Za-z])([)\]]?)(?![\w'’]|\.\w)")
# Where an answer's clause ends (or, before it, starts): a sentence end, or a word
# that starts an explanation ("B, because A is wrong", "B, not A", "A is wrong, so B").
_CLAUSE_BREAK = re.compile(
    r"[.!?](?=\s|$)|\b(?:because|since|as|given|due|so|therefore|thus|hence|but|not|while|"
    r"whereas|which|that|is|are|was|were|rather|instead|unlike|than|wait|actually)\b",
    re.IGNORECASE,
)
_FORMULA = re.compile(r"\s*[=<>^]")  # "F = ma": a variable, not a choice
# Where an aside after the answer opens: "B (A and C are wrong)", "B; A is wrong". An
# aside that explains (holds a clause break) is not part of the answer.
_ASIDE = re.compile(r"[(\[,;:—–]|\s-\s")


@dataclass(frozen=True)
class Reading:
    """What a reply answers: ``answer``, a letter or the answer text; for a choice
    question whose final answer names several choices, ``answer`` is None and ``named``
    holds those letters (``ambiguous``)."""

    answer: str | None
    named: tuple[str, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return len(self.named) > 1


# --- numbers ---------------------------------------------------------------------
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9.^_])(?P<sign>[-+])?(?P<mant>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)"
    r"(?:[eE](?P<e>[-+]?\d{1,4})"
    r"|\s*(?:[x×*·]|\\times|\\cdot)\s*10\s*\^\s*\{?\s*(?P<p>[-+]?\d{1,4})(?:\s*\})?"
    r"|\s*\^\s*\{?\s*(?P<pow>[-+]?\d{1,4})(?:\s*\})?"
    r"|\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.,])"
    r")?"
)


def _clean_number_text(text: str) -> str:
    text = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+", lambda m: "^" + m.group().translate(_SUPERSCRIPTS), text)
    text = text.replace("−", "-").replace("$", "").replace("\\,", "").replace("\\!", "").replace("{,}", ",")
    return re.sub(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", text)


def _number_value(match: re.Match[str]) -> float | None:
    try:
        value = float(match["mant"].replace(",", ""))
        if match["e"] is not None:
            value *= 10.0 ** int(match["e"])
        elif match["p"] is not None:
            value *= 10.0 ** int(match["p"])
        elif match["pow"] is not None:
            value = value ** int(match["pow"])
        elif match["den"] is not None:
            value /= float(match["den"])
    except (OverflowError, ZeroDivisionError, ValueError):
        return None
    value = -value if match["sign"] == "-" else value
    return value if math.isfinite(value) else None


def parse_number(text: str) -> float | None:
    """The first number in ``text``, units after it ignored: ``3.0e8``, ``3 x 10^8``,
    ``3×10⁸``, ``300,000,000``, ``9.8 m/s^2``, ``1/2``; a value after the last ``=``
    (``v = 3e8 m/s``). None when there is none."""
    text = _clean_number_text(str(text)[:_MAX_LINE])
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    match = _NUMBER.search(text)
    return _number_value(match) if match else None


def is_numeric_answer(text: str) -> bool:
    """True if ``text`` is a number, optionally with a unit (``300 K``, ``25%``);
    ``1,2-dichloroethane`` or ``5th`` are not."""
    text = _clean_number_text(str(text).strip())
    match = _NUMBER.match(text)
    if not match or _number_value(match) is None:
        return False
    rest = text[match.end() :]
    return not rest or rest[0] in " \t%°"


def numbers_match(answer: float, gold: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """``answer`` within ``tolerance`` of ``gold``, relative to the gold (absolute when it is 0)."""
    return abs(answer - gold) <= tolerance * (abs(gold) if gold else 1.0)


def normalize_text(text: str) -> str:
    """Case, space and punctuation folded: ``"The Sodium-Chloride."`` -> ``"sodium chloride"``."""
    text = unicodedata.normalize("NFKC", unwrap_latex_text(str(text).strip())).casefold()
    words = re.sub(r"[\W_]+", " ", text).split()
    if len(words) > 1 and words[0] in ("the", "a", "an"):
        words = words[1:]
    return " ".join(words)


# --- extraction --------------------------------------------------------------------
def _clean(candidate: str) -> str:
    text = candidate.strip().strip(_MARKUP).rstrip(" .")
    text = unwrap_latex_text(text).strip().strip(_MARKUP).rstrip(" .")
    return text


def _candidates(text: str, choice: bool) -> list[tuple[int, str, int]]:
    """Explicit answers in ``text`` as (position, text, start of the clause it may
    share), in order of position: a marker's answer starts after the marker, any other
    at the start of its line."""
    found: list[tuple[int, str, int]] = []
    for match in _MARKER.finditer(text):
        end = text.find("\n", match.end())
        found.append((match.start(), text[match.end() : end if end != -1 else len(text)][:_MAX_LINE], match.end()))
    start = text.find("\\boxed")
    while start != -1:
        following = text.find("\\boxed", start + 1)
        end = start + _MAX_LINE if following == -1 else min(following, start + _MAX_LINE)
        boxed = extract_boxed(text[start:end])  # this box only
        if boxed is not None:
            found.append((start, boxed, _line_start(text, start)))
        start = following
    if choice:
        found.extend((m.start(), m.group(1), _line_start(text, m.start())) for m in _BOLD.finditer(text))
        lines = text.rstrip().rsplit("\n", 1)
        last_line = len(text.rstrip()) - len(lines[-1])
        found.append((last_line, "\n" + lines[-1][:_MAX_LINE], last_line))
    return sorted(found, key=lambda item: item[0])


def _line_start(text: str, position: int) -> int:
    return text.rfind("\n", 0, position) + 1


def _named_letters(text: str, position: int, floor: int, letters: str) -> tuple[str, ...]:
    """The choice letters named in the clause of the answer at ``position`` (no
    earlier than ``floor``, on the same line, within ``_MAX_LINE`` of it), in order."""
    line_end = text.find("\n", position)
    line_end = min(len(text) if line_end == -1 else line_end, position + _MAX_LINE)
    left = max(floor, position - _MAX_LINE)
    for match in _CLAUSE_BREAK.finditer(text, left, position):
        left = match.end()
    first = _LETTER_TOKEN.search(text, position, line_end)
    after = first.end() if first else position
    stop = _CLAUSE_BREAK.search(text, after, line_end)
    right = line_end
    if stop:
        right = stop.start()
        asides = list(_ASIDE.finditer(text, after, right))
        if asides:  # the explanation starts where its aside opens
            right = asides[-1].start()
    named: list[str] = []
    lower_counts: bool | None = None  # a bare lowercase letter counts if the first letter is one
    for match in _LETTER_TOKEN.finditer(text, left, right):
        bracket, char, close = match.groups()
        bare = not (bracket or close)
        word = re.match(r"\s+([a-z]+)", text[match.end() : right])
        if bare and char in "AaIi" and word and word.group(1) not in _CONNECTORS:
            continue  # "A ball", "I think", "a metal"
        if bare and (_FORMULA.match(text, match.end()) or re.search(r"[=<>^]\s*$", text[left : match.start()])):
            continue  # "F = ma"
        if lower_counts is None:
            lower_counts = bare and char.islower()
        if bare and char.islower() and not lower_counts:
            continue  # "B, the speed of light c"
        letter = char.upper()
        if letter in letters and letter not in named:
            named.append(letter)
    return tuple(named)


def _without_option_text(text: str, option: str) -> str:
    """``text`` with each occurrence of ``option`` (case-insensitive; a single character
    is not an option's words) blanked out, every other position kept."""
    words = option.strip()
    if len(words) < 2:
        return text
    pattern = re.compile(re.escape(unicodedata.normalize("NFKC", words).translate(_LOOKALIKES)), re.IGNORECASE)
    return pattern.sub(lambda m: " " * len(m.group()), text)


def _letter_of(candidate: str, choices: list[str]) -> str | None:
    """The choice letter ``candidate`` gives, or None. A candidate starting with a
    newline is a final line, which must be a lone letter, "C) text" or "C. text"."""
    letters = LETTERS[: len(choices)]
    final_line = candidate.startswith("\n")
    text = _clean(candidate)
    if final_line:
        match = _FINAL_LINE_LETTER.fullmatch(text)
        if match and match.group(1).upper() in letters:
            return match.group(1).upper()
    else:
        match = _LEAD_LETTER.match(text)
        if match and match.group(2).upper() in letters:
            letter, closed = match.group(2).upper(), bool(match.group(1) or match.group(3))
            after = text[match.end() :]
            word = re.match(r"\s+([a-z]+)", after)
            # "A ball", "I think", "a bit": an article or a pronoun, not a choice.
            if closed or letter not in "AI" or not word or word.group(1) in _CONNECTORS:
                return letter
        match = _TRAILING_LETTER.search(text)
        if match and match.group(1).upper() in letters:
            return match.group(1).upper()
    normalized = normalize_text(text)
    hits = [i for i, choice in enumerate(choices) if normalized and normalize_text(choice) == normalized]
    return letters[hits[0]] if len(hits) == 1 else None


def _value_of(candidate: str, kind: str) -> str | None:
    text = _clean(candidate)
    if not text:
        return None
    if kind == "number" and parse_number(text) is None:
        return None
    if kind == "exact" and not normalize_text(text):
        return None
    return text


def read_answer(text: str, spec: dict[str, Any]) -> Reading | None:
    """The last explicit answer in ``text`` that reads as one for ``spec``: a letter
    for a choice question (or the letters of a hedge, ``Reading.ambiguous``), else the
    answer text. None when there is none."""
    choice = spec["kind"] == "choice"
    if choice:
        text = unicodedata.normalize("NFKC", text).translate(_LOOKALIKES)
    for position, candidate, floor in reversed(_candidates(text, choice)):
        if not choice:
            value = _value_of(candidate, spec["kind"])
            if value is not None:
                return Reading(value)
            continue
        letter = _letter_of(candidate, spec["choices"])
        if letter is None:
            continue
        # The chosen option's own words ("C) Both A and B") name no other choice.
        chosen = _without_option_text(text, str(spec["choices"][LETTERS.index(letter)]))
        named = _named_letters(chosen, max(position, floor), floor, LETTERS[: len(spec["choices"])])
        if len(set(named) | {letter}) > 1:
            return Reading(None, tuple(dict.fromkeys((*named, letter))))
        return Reading(letter)
    return None


def extract_answer(text: str, spec: dict[str, Any]) -> str | None:
    """``read_answer``'s answer: None when there is none or it is ambiguous."""
    reading = read_answer(text, spec)
    return reading.answer if reading else None


# --- scoring (in a scoring worker) -------------------------------------------------
def score_stem_answer(answer: str, spec: dict[str, Any]) -> bool:
    """True if the extracted ``answer`` is right for ``spec``. Runs in a scoring worker."""
    kind, gold = spec["kind"], str(spec["gold"])
    if kind == "choice":
        return answer.strip().upper() == gold
    if kind == "number":
        value, expected = parse_number(answer), parse_number(gold)
        return (
            value is not None
            and expected is not None
            and numbers_match(value, expected, spec.get("tolerance", DEFAULT_TOLERANCE))
        )
    if kind == "exact":
        return normalize_text(answer) == normalize_text(gold)
    if kind == "expression":
        return verify_math_answer(answer, gold)
    raise ValueError(f"unknown answer kind {kind!r}")

"""LaTeX answers, shared by the math and stem families: the content of a ``\\boxed{}``,
words wrapped in ``\\text{}``, and math-verify's equivalence of two answers.

Extraction is cheap (it runs in the event loop); ``verify_math_answer`` runs inside
``ScoringPool`` workers, so this module imports only math-verify (lazily): the fork
server preloads it.
"""

from __future__ import annotations

import re

# Seconds math-verify may spend on one parse or one comparison. Its own timeouts
# (SIGALRM, fine here: a worker runs tasks in its main thread) keep a worker alive
# on a merely slow answer; the pool's timeout is the hard bound behind them, for
# time spent in C code that no signal interrupts.
MATH_VERIFY_TIMEOUT = 3

BOXED = "\\boxed"


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or None.

    Also accepts ``\\boxed {..}``. An unclosed or blank box counts as no answer.
    """
    start = text.rfind(BOXED)
    while start != -1:
        content = _braced_after(text, start + len(BOXED))
        if content is not None and content.strip():
            return content.strip()
        start = text.rfind(BOXED, 0, start)
    return None


THINK_END = "</think>"


def boxed_answers(text: str) -> list[str]:
    """The distinct non-blank ``\\boxed{...}`` contents in ``text`` (two that differ only
    in spaces are one), in the order of their last occurrence, so the last is
    ``extract_boxed``'s: several mean several final answers. A reasoning model's
    thinking (up to its last ``</think>``) is not its answer: boxes there are not read."""
    text = text.rpartition(THINK_END)[2]
    answers: dict[str, str] = {}
    start = text.find(BOXED)
    while start != -1:
        content = _braced_after(text, start + len(BOXED))
        if content is not None and content.strip():
            key = "".join(content.split())
            answers.pop(key, None)
            answers[key] = content.strip()
        start = text.find(BOXED, start + len(BOXED))
    return list(answers.values())


def _braced_after(text: str, pos: int) -> str | None:
    """The balanced ``{...}`` group starting at ``pos`` (after spaces), without braces."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    for i in range(pos, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : i]
    return None


_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}$")


def unwrap_latex_text(answer: str) -> str:
    """``\\text{yes}`` -> ``yes``: reasoning-gym compares plain strings, but a model
    asked to box its answer often wraps words in ``\\text{}`` or ``\\mathrm{}``."""
    match = _TEXT_WRAPPER.match(answer.strip())
    return match.group(1).strip() if match else answer


# --- math-verify ---------------------------------------------------------------
# A plain integer: ASCII digits only (``\\d`` would take other scripts' digits, which
# math-verify may read otherwise), an optional minus, at most 18 digits.
_PLAIN_INTEGER = re.compile(r"-?[0-9]{1,18}")


def plain_integer_verdict(answer: str, gold: str) -> bool | None:
    """math-verify's verdict where both ``answer`` and ``gold`` are plain integers
    (``42``, ``-7``, ``007``; spaces around them ignored): equal as integers, so it
    runs on the event loop in microseconds instead of a scoring worker's milliseconds
    (math-verify parses each side with sympy). None for anything else (``12.0``,
    ``1,000``, ``x=7``, ``+3``), which only math-verify decides.
    ``tests/handlers/test_math_handler.py`` holds it to math-verify's own verdicts.
    """
    a, g = answer.strip(), gold.strip()
    if _PLAIN_INTEGER.fullmatch(a) is None or _PLAIN_INTEGER.fullmatch(g) is None:
        return None
    return int(a) == int(g)


def verify_math_answer(answer: str, gold: str) -> bool:
    """True if ``answer`` (an extracted final answer) equals ``gold`` mathematically.

    The gold is parsed as written and wrapped in ``$...$`` (math-verify's LaTeX
    extraction wants a math environment; a bare ``\\frac{1}{2}`` or ``x=7`` may
    parse only one way); the answer is re-boxed so math-verify reads it the way
    the prompt asked for it. Runs in a scoring worker.
    """
    from math_verify import parse, verify

    predicted = parse("\\boxed{" + answer + "}", parsing_timeout=MATH_VERIFY_TIMEOUT)
    if not predicted:
        return False
    for gold_text in dict.fromkeys((gold, f"${gold}$")):
        parsed_gold = parse(gold_text, parsing_timeout=MATH_VERIFY_TIMEOUT)
        if parsed_gold and verify(parsed_gold, predicted, timeout_seconds=MATH_VERIFY_TIMEOUT):
            return True
    return False

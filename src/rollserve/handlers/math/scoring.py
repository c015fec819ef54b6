"""Answer extraction (cheap, in the event loop) and the scoring functions that run
inside ``ScoringPool`` workers (CPU-heavy, so never in the event loop).

Kept apart from ``math.handler`` so a scoring worker imports only what scoring
needs (math-verify, reasoning-gym), not the agent and LLM stack; the fork server
preloads this module.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

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


# --- reasoning-gym ---------------------------------------------------------------
def dataset_key(config: dict[str, Any]) -> str:
    """A hashable, canonical form of a dataset config (for caches)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@lru_cache(maxsize=64)
def reasoning_gym_dataset(name: str, seed: int, size: int, config_key: str) -> Any:
    """The reasoning-gym dataset for (name, seed, size, config), built once per process.

    Entries are generated on demand from ``Random(seed + index)``, so building a
    dataset is cheap; caching it spares re-reading word lists and the like.
    """
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_key))


def generate_reasoning_gym_task(
    name: str, seed: int, size: int, config_key: str, index: int
) -> dict[str, str | None]:
    """Question and gold answer of entry ``index``. Runs in a scoring worker.

    Only plain strings travel back; some datasets have no single gold answer
    (their scorer checks the answer itself), then ``answer`` is None.
    """
    entry = reasoning_gym_dataset(name, seed, size, config_key)[index]
    answer = entry.get("answer")
    return {"question": str(entry["question"]), "answer": None if answer is None else str(answer)}


def score_reasoning_gym_answer(
    answer: str, name: str, seed: int, size: int, config_key: str, index: int
) -> float:
    """The dataset's own ``score_answer`` for entry ``index``. Runs in a scoring worker.

    The entry is regenerated here (deterministic by seed and index) rather than
    shipped from the server, so no reasoning-gym object has to cross a pickle.
    """
    dataset = reasoning_gym_dataset(name, seed, size, config_key)
    reward = dataset.score_answer(unwrap_latex_text(answer), dataset[index])
    return float(reward or 0.0)

"""The reasoning-gym functions that run inside ``ScoringPool`` workers: generating an
entry's question and gold answer, and the dataset's own scorer (CPU-heavy, so never
in the event loop).

Kept apart from ``math.handler`` so a scoring worker imports only what scoring
needs (reasoning-gym, ``handlers.latex``), not the agent and LLM stack; the fork
server preloads this module.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from rollserve.handlers.latex import unwrap_latex_text


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


def generate_reasoning_gym_task(name: str, seed: int, size: int, config_key: str, index: int) -> dict[str, str | None]:
    """Question and gold answer of entry ``index``. Runs in a scoring worker.

    Only plain strings travel back; some datasets have no single gold answer
    (their scorer checks the answer itself), then ``answer`` is None.
    """
    entry = reasoning_gym_dataset(name, seed, size, config_key)[index]
    answer = entry.get("answer")
    return {"question": str(entry["question"]), "answer": None if answer is None else str(answer)}


def score_reasoning_gym_answer(answer: str, name: str, seed: int, size: int, config_key: str, index: int) -> float:
    """The dataset's own ``score_answer`` for entry ``index``. Runs in a scoring worker.

    The entry is regenerated here (deterministic by seed and index) rather than
    shipped from the server, so no reasoning-gym object has to cross a pickle.
    """
    dataset = reasoning_gym_dataset(name, seed, size, config_key)
    reward = dataset.score_answer(unwrap_latex_text(answer), dataset[index])
    return float(reward or 0.0)

"""A policy filling the tokenizer's piece cache through the HTTP API: its replies are
4-byte characters (~3-4 ids each), different every rollout, and the fidelity check
encodes them. The cache counts the bytes its ids hold, so what it keeps stays within
its bound however many such replies come back (a bound on characters kept ~40 bytes
a character: ~160 MB per tokenizer)."""

from __future__ import annotations

import random
import sys

from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.testing import FakeVLLM

BOUND = 256 * 1024  # bytes, set on the server's own tokenizer's cache for this test
ROLLOUTS = 24
WIDE = [chr(c) for c in range(0x1F300, 0x1F6FF)]


def policy(prompt_ids: list[int], prompt: str) -> str:
    rng = random.Random(prompt)  # a different reply for every question
    return "".join(rng.choices(WIDE, k=1500)) + " \\boxed{12}"


async def test_a_policys_wide_replies_cannot_grow_the_piece_cache_past_its_bound(make_api, monkeypatch):
    encoder = ChatTokenizer.load("smollm2")._segments  # (the server's tokenizer: loaded once per process)
    assert encoder is not None
    monkeypatch.setattr(encoder._cache, "limit", BOUND)
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as llm:
        _, client = await make_api([llm.url])
        tasks = [
            {"data_source": "math", "instance": {"question": f"Question {i}: 7 + 5?", "answer": "12"}}
            for i in range(ROLLOUTS)
        ]
        r = await client.post("/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 8000}})
        assert r.status_code == 202, r.text
        for group in r.json()["groups"]:
            view = (await client.get(f"/v1/rollouts/{group['rollout_ids'][0]}", params={"wait": 120})).json()
            assert view["done"], view
            assert view["result"]["status"] == "completed", view["result"]
    held = encoder._cache.items()
    wide = [(piece, ids) for piece, ids in held if any(ch in WIDE for ch in piece[:50])]
    assert wide, "the replies' text went through the cache"
    assert sum(len(ids) for _, ids in wide) > 2 * sum(len(piece) for piece, _ in wide)  # ids outnumber characters
    assert len(wide) < ROLLOUTS  # older replies were dropped to stay within the bound
    counted = sum(sys.getsizeof(piece) + sys.getsizeof(ids) for piece, ids in held)
    assert counted <= encoder._cache.total <= BOUND

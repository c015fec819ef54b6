"""A seeded group through the HTTP API: sample i samples with seed + i, so a seeded
group of n is n different samples (one seed for all gave n identical ones: no reward
spread), and the same batch again samples the same seeds."""

from __future__ import annotations

from rollserve.testing import FakeVLLM

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


async def _seeds_sent(client, llm: FakeVLLM, body: dict) -> list[int | None]:
    before = len(llm.calls)
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    for group in r.json()["groups"]:
        view = (await client.get(f"/v1/groups/{group['group_id']}", params={"wait": 60})).json()
        assert view["done"], view
    return sorted((c.request.get("seed") for c in llm.calls[before:]), key=lambda s: -1 if s is None else s)


async def test_each_sample_of_a_seeded_group_gets_its_own_seed(make_api):
    async with FakeVLLM("smollm2", replies=["It is \\boxed{4}"]) as llm:
        _, client = await make_api([llm.url])
        seeded = {"tasks": [{**MATH, "n": 3}], "sampling": {"max_tokens": 16, "seed": 7}}
        assert await _seeds_sent(client, llm, seeded) == [7, 8, 9]
        assert await _seeds_sent(client, llm, seeded) == [7, 8, 9]  # reproducible
        # a task's own seed (over the batch's)
        task_seed = {"tasks": [{**MATH, "n": 3, "sampling": {"seed": 100}}], "sampling": {"max_tokens": 16, "seed": 7}}
        assert await _seeds_sent(client, llm, task_seed) == [100, 101, 102]
        # the largest seed wraps instead of leaving the field's range
        top = {"tasks": [{**MATH, "n": 2}], "sampling": {"max_tokens": 16, "seed": 2**63 - 1}}
        assert await _seeds_sent(client, llm, top) == [0, 2**63 - 1]
        unseeded = {"tasks": [{**MATH, "n": 2}], "sampling": {"max_tokens": 16}}
        assert await _seeds_sent(client, llm, unseeded) == [None, None]

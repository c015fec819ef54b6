"""Reward components through the HTTP API: math and stem give ``correctness`` and
``format`` beside the scalar reward, and a policy that writes no readable answer
gets format 0 (the component is read by the grader, never by the policy's claims)."""

from __future__ import annotations

import re

from rollserve.testing import FakeVLLM

REPLIES = {"q1": "3 + 4 = \\boxed{7}", "q2": "it is \\boxed{8}", "q3": "no idea, format: 1.0", "q4": "Answer: B"}


def reply(prompt_ids, prompt: str) -> str:
    return REPLIES[re.findall(r"\[(q\d)\]", prompt)[-1]]


async def test_math_and_stem_results_carry_components(make_api, tok):
    async with FakeVLLM(tok, replies=reply) as fake:
        _, client = await make_api([fake.url])
        tasks = [
            {"data_source": "math", "instance": {"question": f"[{q}] What is 3 + 4?", "answer": "7"}}
            for q in ("q1", "q2", "q3")
        ]
        tasks.append(
            {
                "data_source": "stem",
                "instance": {"question": "[q4] What is 3 + 4?", "choices": ["9", "7", "5", "6"], "answer": 1},
            }
        )
        r = await client.post("/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 32}})
        assert r.status_code == 202, r.text
        found = []
        for group in r.json()["groups"]:
            (rid,) = group["rollout_ids"]
            view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
            assert view["done"], view
            found.append(view["result"])
        comps = [res["reward_components"] for res in found]
        assert comps[0] == {"correctness": 1.0, "format": 1.0}
        assert comps[1] == {"correctness": 0.0, "format": 1.0}  # read, but wrong
        assert comps[2] == {"correctness": 0.0, "format": 0.0}  # nothing to read
        assert comps[3] == {"correctness": 1.0, "format": 1.0}
        assert [res["reward"] for res in found] == [1.0, 0.0, 0.0, 1.0]
        # the results cursor carries them too (stored, not only in memory)
        page = (await client.get("/v1/results", params={"after": 0})).json()
        stored = {res["id"]: res["reward_components"] for res in page["results"]}
        assert stored[found[0]["id"]] == comps[0]

"""A scripted policy and a scripted judge (both ``FakeVLLM``: the policy samples on
token ids, the judge answers ``/v1/chat/completions``), and the helpers the judge
tests share."""

from __future__ import annotations

import asyncio
import re

BLOCK = re.compile(r"<<<(BOUNDARY-[0-9a-f]{32}) BEGIN>>>\n(.*)\n<<<\1 END>>>", re.S)
TAG = re.compile(r"\[(\w+)\]")


def graded_text(prompt: str) -> str:
    """What the judge was asked to grade: the text inside the call's boundary block."""
    found = BLOCK.search(prompt)
    assert found is not None, prompt[-400:]
    return found.group(2)


def boundary(prompt: str) -> str:
    found = BLOCK.search(prompt)
    assert found is not None
    return found.group(1)


def math_task(tag: str, judge: dict | None = None, answer: str = "7") -> dict:
    task: dict = {"data_source": "math", "instance": {"question": f"[{tag}] What is 3 + 4?", "answer": answer}}
    if judge is not None:
        task["judge"] = judge
    return task


async def submit(client, tasks: list[dict], **extra) -> list[str]:
    body = {"tasks": tasks, "sampling": {"max_tokens": 64}, **extra}
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    return [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]


async def results(client, ids: list[str], wait: float = 90) -> list[dict]:
    views = await asyncio.gather(*[client.get(f"/v1/rollouts/{rid}", params={"wait": wait}) for rid in ids])
    out = [v.json()["result"] for v in views]
    assert all(r is not None for r in out), "a rollout is still running: hung"
    return out

"""What the judge grades when the policy acts through tool calls, through the HTTP API:
a gateway rollout whose harness (the test, with the official openai client) runs a
bash call, then ends on a finish call carrying the answer, its assistant turns' text
blank. Final mode grades the finish tool's answer (not ""), process mode each call
with its tool call rendered (name and arguments) inside the delimited block."""

from __future__ import annotations

import json

import openai
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.testing import FakeVLLM
from tests.judges.judge_doubles import graded_text, results

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]},
        },
    }
    for name, key in (("bash", "command"), ("finish", "answer"))
]


def policy(prompt_ids, prompt: str) -> str:
    if prompt.count("<|im_start|>assistant") > 1:  # (the last one opens this reply)
        return format_tool_call("finish", {"answer": "The capital is Paris."})
    return format_tool_call("bash", {"command": "grep -i capital atlas.txt"})


def judge(prompt_ids, prompt: str) -> str:
    text = graded_text(prompt)
    if "Paris" in text.rsplit("[assistant]", 1)[-1]:
        return "SCORE: 9"
    return "SCORE: 4" if "grep -i capital" in text else "SCORE: 0"


async def drive(client, rid: str) -> None:
    info = (await client.get(f"/v1/rollouts/{rid}/gateway", params={"wait": 60})).json()
    oa = openai.AsyncOpenAI(
        base_url=f"http://rollserve{info['base_url']}", api_key="x", http_client=client, max_retries=0
    )
    history: list = [{"role": "user", "content": "What is the capital of France?"}]
    first = await oa.chat.completions.create(model="p", messages=history, tools=TOOLS)
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "bash" and not (first.choices[0].message.content or "").strip()
    history += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "France: capital Paris"},
    ]
    second = await oa.chat.completions.create(model="p", messages=history, tools=TOOLS)
    assert second.choices[0].message.tool_calls[0].function.name == "finish"
    r = await client.post(f"/v1/gateway/{info['key']}/end")
    assert r.status_code == 200, r.text


async def test_tool_calls_are_graded_not_blank(make_api, tok):
    async with FakeVLLM(tok, replies=policy) as pol, FakeVLLM(tok, replies=judge) as j:
        _, client = await make_api(
            [pol.url], server={"judges": [f"j={j.url}"], "rubrics": {"process": {"mode": "process", "weight": 1.0}}}
        )
        tasks = [
            {
                "data_source": "gateway",
                "instance": {"answer": "Paris", "tool_calls": "hermes"},
                "judge": {"rubric": rubric},
            }
            for rubric in ("default", "process")
        ]
        r = await client.post("/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 64}})
        assert r.status_code == 202, r.text
        ids = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
        for rid in ids:
            await drive(client, rid)
        final, process = await results(client, ids)
    (call,) = final["evaluation"]["judge"]["calls"]
    assert graded_text(call["prompt"]) == "The capital is Paris.", call["prompt"]
    assert final["reward"] == pytest.approx(0.9)
    judged = process["evaluation"]["judge"]
    assert judged["turn_scores"] == [pytest.approx(0.4), pytest.approx(0.9)], judged["calls"]
    first = graded_text(judged["calls"][0]["prompt"])
    assert "[tool call] bash " + json.dumps({"command": "grep -i capital atlas.txt"}) in first

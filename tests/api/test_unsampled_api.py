"""No sample the policy did not produce is scored, and a result's tokens are exactly its
turns: through the HTTP API with a scripted policy."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM


async def _result(client, body) -> dict:
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    rid = r.json()["groups"][0]["rollout_ids"][0]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
    assert view["done"], view
    return view["result"]


def turns_laid_end_to_end(result: dict) -> list[int]:
    return [i for t in result["trajectory"]["turns"] for i in t["prompt_ids_delta"] + t["output_ids"]]


async def test_a_prompt_longer_than_the_context_is_masked_not_scored(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    question = "What is 2 + 2? " + "Think about it carefully. " * 40
    result = await _result(
        client,
        {
            "tasks": [{"data_source": "math", "instance": {"question": question, "answer": "4"}}],
            "agent": {"max_context_tokens": 64},
        },
    )
    assert result["reward"] is None and result["mask"] is True
    assert result["status"] == "failed"
    assert result["failure"]["kind"] == "infra" and result["failure"]["stage"] == "run"
    assert "opening prompt" in result["failure"]["message"]
    assert "max_context_tokens is 64" in result["failure"]["message"]
    assert fake_llm.calls == []  # nothing was asked of the policy
    tokens = result["trajectory"]["tokens"]
    assert tokens["input_ids"] == [] and result["trajectory"]["turns"] == []
    assert result["stats"]["prompt_tokens"] == 0


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_a_failed_rollouts_tokens_are_exactly_its_turns(make_api):
    """The policy calls a tool, then the inference server breaks: the tool's output was
    rendered as the next prompt delta, but no turn was sampled after it."""
    server: FakeVLLM

    def policy(prompt_ids: list[int], prompt: str) -> str:
        server.fail_next(10, mode="error", status=500)  # every later call fails
        return format_tool_call("bash", {"command": "echo the tool ran"})

    async with FakeVLLM("smollm2", replies=policy) as server:
        _, client = await make_api([server.url])
        result = await _result(
            client,
            {
                "tasks": [
                    {
                        "data_source": "code",
                        "instance": {"problem": "Print 1.", "tests": [{"input": "", "output": "1\n"}]},
                    }
                ]
            },
        )
    assert result["status"] == "failed" and result["mask"] is True
    assert result["failure"]["kind"] == "infra" and "500" in result["failure"]["message"]
    turns = result["trajectory"]["turns"]
    assert len(turns) == 1
    assert any("the tool ran" in str(m.get("content")) for m in result["trajectory"]["messages"])
    tokens = result["trajectory"]["tokens"]
    assert tokens["input_ids"] == turns_laid_end_to_end(result)
    assert len(tokens["loss_mask"]) == len(tokens["logprobs"]) == len(tokens["input_ids"])
    assert sum(tokens["loss_mask"]) == len(turns[0]["output_ids"])
    assert result["stats"]["prompt_tokens"] + result["stats"]["output_tokens"] == len(tokens["input_ids"])

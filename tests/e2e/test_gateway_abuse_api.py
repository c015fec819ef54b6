"""A hostile or broken harness against the gateway, through the HTTP API: a flood of
concurrent calls, nesting that breaks JSON decoding, messages the chat template
refuses, a harness that ends without a call, a late system message, NaN arguments."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from rollserve.agent.gateway.session import MAX_WAITING_CALLS, GatewaySession
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import BASH, end, harness_for, policy, result, submit
from tests.waiting import eventually


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def chat(client, key: str, body: dict):
    return await client.post(f"/v1/gateway/{key}/v1/chat/completions", json=body)


async def test_a_harness_that_ends_without_a_call_is_masked_not_scored(make_api, llm):
    _, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    await end(client, key)
    done = await result(client, rollout_id)
    # Nothing the policy sampled: no reward of 0 scored against the policy.
    assert done["mask"] and done["reward"] is None and done["failure"]["kind"] == "infra"
    assert "before the harness made a model call" in done["failure"]["message"]
    assert llm.calls == []


async def test_a_flood_of_concurrent_calls_is_refused_past_the_queue(make_api, monkeypatch):
    gate = asyncio.Event()

    async def slow(prompt_ids: list[int], prompt: str) -> str:
        await gate.wait()
        return "ok"

    admitted: list[GatewaySession] = []  # calls the session has admitted, not yet answered
    admit = GatewaySession.admitted

    @contextlib.contextmanager
    def counted(self: GatewaySession) -> Iterator[None]:
        with admit(self):
            admitted.append(self)
            try:
                yield
            finally:
                admitted.remove(self)

    monkeypatch.setattr(GatewaySession, "admitted", counted)
    async with FakeVLLM("smollm2", replies=slow, latency=0.0) as server:
        _, client = await make_api([server.url])
        (rollout_id,) = await submit(client)
        key, _ = await harness_for(client, rollout_id)
        body = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        calls = [asyncio.create_task(chat(client, key, body)) for _ in range(MAX_WAITING_CALLS)]
        # until they all are in the session (one at the backend)
        await eventually(
            lambda: len(admitted) == MAX_WAITING_CALLS and server.calls,
            what=f"{MAX_WAITING_CALLS} calls admitted, one at the backend",
        )
        refused = await asyncio.wait_for(chat(client, key, body), 30)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_calls"
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert [a.status_code for a in answers] == [200] * MAX_WAITING_CALLS
        await end(client, key)


async def test_bad_messages_are_400_never_500(make_api, llm):
    _, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    deep = "[" * 50_000 + "]" * 50_000  # RecursionError for json, not a ValueError
    calls = [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": deep}}]
    r = await chat(
        client,
        key,
        {
            "model": "p",
            "tools": [BASH],
            "messages": [
                {"role": "user", "content": "hi [script:x]"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
            ],
        },
    )
    assert r.status_code in (200, 400), r.text  # written as raw text, or refused: never 500
    # A content part the gateway cannot render is refused naming it, and the session
    # still answers afterwards.
    r = await chat(
        client,
        key,
        {"model": "p", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]"
    r = await chat(client, key, {"model": "p", "messages": [{"role": "user", "content": "hi [script:x]"}]})
    assert r.status_code == 200, r.text
    await end(client, key)


async def test_a_late_system_message_does_not_repeat_the_tools_section(make_api):
    prompts: list[str] = []

    def remember(prompt_ids: list[int], prompt: str) -> str:
        prompts.append(prompt)
        return "fine"

    async with FakeVLLM("smollm2", replies=remember, latency=0.0) as server:
        _, client = await make_api([server.url])
        (rollout_id,) = await submit(client)
        key, _ = await harness_for(client, rollout_id)
        messages = [{"role": "user", "content": "hi"}]
        first = await chat(client, key, {"model": "p", "messages": messages, "tools": [BASH]})
        assert first.status_code == 200, first.text
        messages += [
            first.json()["choices"][0]["message"],
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "again"},
        ]
        second = await chat(client, key, {"model": "p", "messages": messages, "tools": [BASH]})
        assert second.status_code == 200, second.text
        await end(client, key)
        assert len(prompts) == 2 and prompts[1].startswith(prompts[0])  # append-only
        assert prompts[1].count("# Tools") == 1, prompts[1]


async def test_nan_arguments_are_not_a_tool_call(make_api):
    async def nan(prompt_ids: list[int], prompt: str) -> str:
        return '<tool_call>\n{"name": "bash", "arguments": {"command": NaN}}\n</tool_call>'

    async with FakeVLLM("smollm2", replies=nan, latency=0.0) as server:
        _, client = await make_api([server.url])
        (rollout_id,) = await submit(client)
        key, _ = await harness_for(client, rollout_id)
        r = await chat(client, key, {"model": "p", "tools": [BASH], "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert not message.get("tool_calls") and "NaN" in message["content"]
        await end(client, key)
        done = await result(client, rollout_id)
        assert done["trajectory"]["turns"][0]["tool_calls"] == []

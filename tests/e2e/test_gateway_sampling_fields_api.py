"""Request fields the JavaScript harnesses (OpenCode, Qwen Code, Pi) send on the
gateway's Chat Completions wire: those that only shape the answer are served, those
that would constrain what the policy samples are refused with a 400 naming the field,
never silently not honoured, and never reach the backend."""

from __future__ import annotations

import pytest

from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import BASH, end, harness_for, result, submit


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=("DONE",), latency=0.0) as server:
        yield server


USER = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]

# As the harnesses sent them (logged from OpenCode 1.18.33, Qwen Code 0.24.4, Pi 0.73.1).
SERVED = [
    {
        "tool_choice": "auto",
        "tools": [BASH],
        "max_tokens": 32000,
        "stream": True,
        "stream_options": {"include_usage": True},
    },  # OpenCode
    {
        "store": False,
        "max_completion_tokens": 16384,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {**BASH["function"], "strict": False}}],
    },  # Pi
    {"tool_choice": "none"},  # none, with no tools offered
    {"response_format": {"type": "text"}, "parallel_tool_calls": False},
]
REFUSED = [
    ({"tool_choice": "required", "tools": [BASH]}, "tool_choice"),
    ({"tool_choice": "none", "tools": [BASH]}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "bash"}}, "tools": [BASH]}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    # Pi's default for a model marked "reasoning" (its preset marks none)
    ({"reasoning_effort": "medium", "messages": [{"role": "developer", "content": "x"}, *USER]}, "reasoning_effort"),
]


async def test_shape_fields_are_served_sampling_constraints_refused_by_name(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="DONE", max_turns=20)
    key, _ = await harness_for(client, rollout_id)
    url = f"/v1/gateway/{key}/v1/chat/completions"
    for fields, param in REFUSED:
        r = await client.post(url, json={"model": "p", "messages": USER, **fields})
        assert r.status_code == 400, (fields, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert "not served" in error["message"], error
    assert llm.calls == []  # a refused request samples nothing
    for fields in SERVED:
        r = await client.post(url, json={"model": "p", "messages": USER, **fields})
        assert r.status_code == 200, (fields, r.text)
        if fields.get("stream"):
            assert r.text.rstrip().endswith("data: [DONE]") and '"usage"' in r.text
        else:
            assert r.json()["choices"][0]["message"]["content"] == "DONE"
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["stats"]["gateway_calls"] == len(SERVED) == len(llm.calls)

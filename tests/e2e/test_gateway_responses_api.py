"""The recording gateway's OpenAI Responses route through the HTTP API: the official
``openai`` client's ``responses`` plays the harness (``base_url`` = the gateway's key
path, as ``OPENAI_BASE_URL`` would set it), the scripted vLLM double plays the policy,
and every trajectory is checked token for token against the double's log."""

from __future__ import annotations

import json

import openai
import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_anthropic_api import call, max_tokens
from tests.e2e.test_gateway_api import (
    TAG,
    assert_exact,
    assert_tool_round_trip,
    end,
    harness_for,
    result,
    submit,
)
from tests.e2e.test_gateway_sandbox_api import run_sandboxed

BASH = {
    "type": "function",
    "name": "bash",
    "description": "run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
TEXT_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
]


def policy(prompt_ids: list[int], prompt: str) -> str:
    """Scripted replies: by the task's tag and how many assistant turns the prompt has."""
    script = TAG.findall(prompt)[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    if script == "tools":
        return [
            f"Let me compute.\n{call('bash', {'command': 'echo 6*7'})}",
            call("bash", {"command": "echo done"}),
            "42",
        ][min(turn, 2)]
    if script == "two" and turn == 0:
        return call("bash", {"command": "echo a"}) + "\n" + call("bash", {"command": "echo b"})
    return f"reply {turn} of {script}"


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


def echoed(output: list) -> list[dict]:
    """The output items as a harness sends them back in its next input."""
    return [item.model_dump(exclude_none=True) for item in output]


async def test_responses_function_call_round_trip_streamed_and_not_is_token_exact(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, harness = await harness_for(client, rollout_id)
    instructions = "You are a calculator. [script:tools]"
    history: list[dict] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "What is 6*7?"}]},
    ]
    first = await harness.responses.create(model="policy", instructions=instructions, input=history, tools=[BASH])
    assert first.status == "completed" and first.object == "response"
    text, fc = first.output
    assert text.type == "message" and text.content[0].text == "Let me compute."
    assert fc.type == "function_call" and fc.call_id.startswith("call_")
    assert (fc.name, json.loads(fc.arguments)) == ("bash", {"command": "echo 6*7"})
    assert first.usage is not None
    assert first.usage.output_tokens == len(llm.calls[0].output_ids)
    assert first.usage.input_tokens == len(llm.calls[0].prompt_ids)
    history += [*echoed(first.output), {"type": "function_call_output", "call_id": fc.call_id, "output": "42"}]
    # Streamed: the events in OpenAI's order; the SDK's helper assembles the response.
    async with harness.responses.stream(
        model="policy", instructions=instructions, input=history, tools=[BASH]
    ) as stream:
        kinds = [event.type async for event in stream]
        second = await stream.get_final_response()
    assert kinds == ["response.created", "response.in_progress", *CALL_EVENTS, "response.completed"]
    (fc2,) = second.output
    assert fc2.type == "function_call" and json.loads(fc2.arguments) == {"command": "echo done"}
    assert second.usage is not None and second.usage.output_tokens == len(llm.calls[1].output_ids)
    history += [
        *echoed(second.output),
        {"type": "function_call_output", "call_id": fc2.call_id, "output": [{"type": "input_text", "text": "done"}]},
        {"type": "message", "role": "user", "content": "So?"},
    ]
    raw = await harness.responses.create(
        model="policy", instructions=instructions, input=history, tools=[BASH], stream=True
    )
    events = [event async for event in raw]
    assert [e.type for e in events] == ["response.created", "response.in_progress", *TEXT_EVENTS, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    delta = events[4]
    assert delta.delta == "42" and events[-1].response.output_text == "42"
    assert events[-1].response.usage.input_tokens == len(llm.calls[2].prompt_ids)
    await end(client, key)

    assert_tool_round_trip(await result(client, rollout_id), llm.calls, fc.call_id)
    last_prompt = llm.tok.decode(llm.calls[2].prompt_ids)
    assert "You are a calculator." in last_prompt and "done" in last_prompt
    # The instructions and the developer item are one system message (one system prompt).
    assert last_prompt.count("<|im_start|>system") == 1
    assert "[script:tools]\n\nBe brief." in last_prompt
    # The key died with its rollout: a 401 in OpenAI's error shape.
    with pytest.raises(openai.AuthenticationError) as refused:
        await harness.responses.create(model="p", input="again")
    assert refused.value.body["code"] == "invalid_api_key"


async def test_string_input_reasoning_items_and_a_cut_reply(make_api, llm):
    """A string input is one user message; reasoning items (which the gateway never
    emits) are left out of the render, so they do not break the append-only reuse; a
    sample cut at ``max_output_tokens`` is an incomplete response."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="reply 1 of plain")
    key, harness = await harness_for(client, rollout_id)
    first = await harness.responses.create(model="p", input="hello [script:plain]")
    assert first.output_text == "reply 0 of plain"
    history = [
        {"role": "user", "content": "hello [script:plain]"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "encrypted_content": "INJECTED-1",
            "summary": [{"type": "summary_text", "text": "INJECTED-2"}],
        },
        *echoed(first.output),
        {"role": "user", "content": "more"},
    ]
    second = await harness.responses.create(model="p", input=history, max_output_tokens=100_000)
    assert second.output_text == "reply 1 of plain" and max_tokens(llm.calls[1]) == 64
    assert "INJECTED" not in llm.tok.decode(llm.calls[1].prompt_ids)  # nothing of it rendered
    cut = await harness.responses.create(model="p", input="[script:cut]", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 2 == max_tokens(llm.calls[2])
    async with harness.responses.stream(model="p", input="[script:cut]", max_output_tokens=2) as stream:
        kinds = [event.type async for event in stream]
    assert kinds[-1] == "response.incomplete"
    await end(client, key)
    trajectory = (await result(client, rollout_id))["trajectory"]
    assert trajectory["sequence_count"] == 3 and len(llm.calls) == 4
    assert_exact(trajectory["sequences"][0], llm.calls[:2])  # the reasoning item: no new sequence


async def test_parallel_function_calls_come_back_as_one_assistant_turn(make_api, llm):
    """Two calls in one reply are two function_call items; sent back with their outputs
    they are the one assistant turn the policy sampled: the next call extends it."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="reply 1 of two")
    key, harness = await harness_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "[script:two] go"}]
    first = await harness.responses.create(model="p", input=history, tools=[BASH])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [json.loads(c.arguments)["command"] for c in calls] == ["echo a", "echo b"]
    assert len(first.output) == 2 and len({c.call_id for c in calls}) == 2
    history += [
        *echoed(first.output),
        *({"type": "function_call_output", "call_id": c.call_id, "output": c.call_id[-4:]} for c in calls),
    ]
    second = await harness.responses.create(model="p", input=history, tools=[BASH])
    assert second.output_text == "reply 1 of two"
    await end(client, key)
    done = await result(client, rollout_id)
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 1 and done["reward"] == 1.0
    assert_exact(trajectory["tokens"], llm.calls)
    assert [c["id"] for c in trajectory["turns"][0]["tool_calls"]] == [c.call_id for c in calls]


async def test_a_function_call_the_harness_edited_is_prompt_not_sample(make_api, llm):
    """A cheating harness sends back the policy's function_call with other arguments:
    the edited call is prompt in a new sequence, never sample."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="none")
    key, harness = await harness_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "[script:tools] compute"}]
    first = await harness.responses.create(model="p", input=history, tools=[BASH])
    items = echoed(first.output)
    assert items[1]["type"] == "function_call"
    items[1]["arguments"] = json.dumps({"command": "cat /secret/answer.txt"})
    history += [*items, {"type": "function_call_output", "call_id": items[1]["call_id"], "output": "42"}]
    await harness.responses.create(model="p", input=history, tools=[BASH])
    await end(client, key)

    trajectory = (await result(client, rollout_id))["trajectory"]
    assert trajectory["sequence_count"] == 2 and len(llm.calls) == 2
    for recorded, sequence in zip(llm.calls, trajectory["sequences"], strict=True):
        assert_exact(sequence, [recorded])
    last = trajectory["sequences"][-1]
    ids, mask = last["input_ids"], last["loss_mask"]
    assert "cat /secret/answer.txt" in llm.tok.decode([i for i, m in zip(ids, mask) if m == 0])
    sampled = llm.tok.decode([i for i, m in zip(ids, mask) if m == 1])
    assert sampled == llm.tok.decode(llm.calls[1].output_ids) and "secret" not in sampled


async def test_bad_requests_are_400s_naming_the_field(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="none")
    key, harness = await harness_for(client, rollout_id)
    url = f"/v1/gateway/{key}/v1/responses"
    user = {"role": "user", "content": "x"}
    cases = [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": []}, "input"),
        ({"input": [user], "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [user], "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [user], "tools": [BASH, {"type": "custom", "name": "apply_patch"}]}, "tools[1].type"),
        ({"input": [user], "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": [user, {"type": "item_reference", "id": "msg_1"}]}, "input[1].type"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [user, {"type": "function_call", "name": "bash", "arguments": "{}"}]}, "input[1].call_id"),
        ({"input": [user, {"type": "function_call_output", "output": "x"}]}, "input[1].call_id"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]}, "input[0].content[0].text"),
        # Past one validation slice: the bad item is named at its index all the same.
        (
            {
                "input": [user] * 200
                + [{"type": "function_call", "call_id": "c", "name": "bash", "arguments": {"command": "ls"}}]
            },
            "input[200].arguments",
        ),
        ({"input": [user] * 300 + [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[300].content[0]"),
        ({"input": [user], "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [user], "temperature": 7}, "temperature"),
    ]
    for body, field in cases:
        r = await client.post(url, json=body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == field, (field, error)
    r = await client.post(url, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # The official client raises the 400 as the API's own.
    with pytest.raises(openai.BadRequestError) as refused:
        await harness.responses.create(model="p", input="x", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    # The models list answers only a live key.
    listed = await harness.models.list()
    assert [m.id for m in listed.data] == ["rollserve-policy"]
    for bad in ("rsg-made-up", key[:-1]):
        for method, path in (("POST", "responses"), ("GET", "models")):
            r = await client.request(method, f"/v1/gateway/{bad}/v1/{path}", json={"input": "x"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["turns"] == [] and len(llm.calls) == 0


# A harness (standard library only) inside the rollout's bubblewrap sandbox, speaking the
# Responses wire to OPENAI_BASE_URL: the models list, one call, then one streamed.
SANDBOXED = """
import json, os, urllib.request

def post(path, body=None):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + path,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode()

model = json.loads(post("/models"))["data"][0]["id"]
history = [{"role": "user", "content": "[script:boxed]"}]
first = json.loads(post("/responses", {"model": model, "input": history}))
history += first["output"] + [{"role": "user", "content": "again"}]
events = post("/responses", {"model": model, "input": history, "stream": True})
kinds = [line[7:] for line in events.splitlines() if line.startswith("event: ")]
text = "".join(json.loads(line[6:]).get("delta", "") for line in events.splitlines()
               if line.startswith("data: ") and '"response.output_text.delta"' in line)
print("harness got:", first["output"][0]["content"][0]["text"], "|", text, "|", kinds[-1])
"""


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_a_sandboxed_harness_speaks_responses_through_the_socket(make_api, llm):
    service, client = await make_api([llm.url])
    done = await run_sandboxed(client, SANDBOXED, '"$ROLLSERVE_PYTHON" harness.py')
    expected = "harness got: reply 0 of boxed | reply 1 of boxed | response.completed"
    assert expected in done["evaluation"]["harness_log_tail"]
    assert done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 1 and len(llm.calls) == 2
    assert_exact(trajectory["tokens"], llm.calls)


async def test_sampling_constraints_are_refused_by_the_chat_wires_validator(make_api, llm):
    """tool_choice, text.format and reasoning.effort go into the chat request, so the
    Chat wire's one validator decides: what would constrain the policy's sample is a 400
    naming the Responses field (never accepted and echoed back as honoured); what Codex
    sends (auto, a text format, reasoning without an effort) is served."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="none", max_turns=20)
    key, _ = await harness_for(client, rollout_id)
    url = f"/v1/gateway/{key}/v1/responses"
    user = {"role": "user", "content": "[script:plain] x"}
    refused = [
        ({"tool_choice": "required", "tools": [BASH]}, "tool_choice"),
        ({"tool_choice": "none", "tools": [BASH]}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "bash"}, "tools": [BASH]}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ]
    for fields, param in refused:
        r = await client.post(url, json={"input": [user], **fields})
        assert r.status_code == 400, (fields, r.text)
        error = r.json()["error"]
        assert error["param"] == param and "not served" in error["message"], (fields, error)
    assert llm.calls == []
    served = [
        {"tool_choice": "auto", "tools": [BASH]},
        {"tool_choice": "none"},
        {"text": {"format": {"type": "text"}, "verbosity": "low"}},
        {"reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"]},
    ]
    for fields in served:
        r = await client.post(url, json={"input": [user], **fields})
        assert r.status_code == 200, (fields, r.text)
        assert r.json()["tool_choice"] == fields.get("tool_choice", "auto")
    assert len(llm.calls) == len(served)
    await end(client, key)

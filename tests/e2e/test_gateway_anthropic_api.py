"""The recording gateway's Anthropic Messages route through the HTTP API: the official
``anthropic`` client plays the harness (``base_url`` = the gateway's key path, as
``ANTHROPIC_BASE_URL`` would set it), the scripted vLLM double plays the policy, and
every trajectory is checked token for token against the double's log."""

from __future__ import annotations

import json

import anthropic
import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM, RecordedCall
from tests.e2e.test_gateway_api import TAG, assert_exact, assert_tool_round_trip, end, result, submit
from tests.e2e.test_gateway_sandbox_api import run_sandboxed

BASH = {
    "name": "bash",
    "description": "run a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
STREAM_EVENTS = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


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
    if script == "malformed":
        return 'Let me run it.\n<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>'
    return f"reply {turn} of {script}"


def max_tokens(recorded: RecordedCall) -> int:
    """The max_tokens the backend was asked for (vLLM's completions body, or its
    token-in/token-out body's sampling_params)."""
    body = recorded.request
    return int(body.get("max_tokens") or body["sampling_params"]["max_tokens"])


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def test_anthropic_client_tool_use_round_trip_streamed_and_not_is_token_exact(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, harness = await anthropic_for(client, rollout_id)
    system = "You are a calculator. [script:tools]"
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}]}]
    first = await harness.messages.create(
        model="policy", max_tokens=1024, system=system, messages=messages, tools=[BASH]
    )
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    text, use = first.content
    assert text.type == "text" and text.text == "Let me compute."
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("bash", {"command": "echo 6*7"})
    assert first.usage.output_tokens == len(llm.calls[0].output_ids)
    assert first.usage.input_tokens == len(llm.calls[0].prompt_ids)
    # The harness sends the assistant's blocks back as the client gave them.
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
    ]
    # The SDK's stream helper assembles the tool_use input from input_json_delta.
    async with harness.messages.stream(
        model="policy", max_tokens=1024, system=system, messages=messages, tools=[BASH]
    ) as stream:
        second = await stream.get_final_message()
    assert second.stop_reason == "tool_use" and len(second.content) == 1
    (use2,) = second.content
    assert use2.type == "tool_use" and use2.input == {"command": "echo done"}
    assert second.usage.output_tokens == len(llm.calls[1].output_ids)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in second.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use2.id, "content": [{"type": "text", "text": "done"}]},
                {"type": "text", "text": "So?"},
            ],
        },
    ]
    raw = await harness.messages.create(
        model="policy", max_tokens=1024, system=system, messages=messages, tools=[BASH], stream=True
    )
    events = [event async for event in raw]
    assert [e.type for e in events] == STREAM_EVENTS
    start, block_start, delta, _, message_delta, _ = events
    assert start.message.content == [] and start.message.stop_reason is None
    assert block_start.content_block.type == "text" and block_start.content_block.text == ""
    assert delta.delta.type == "text_delta" and delta.delta.text == "42"
    assert message_delta.delta.stop_reason == "end_turn"
    assert message_delta.usage.output_tokens == len(llm.calls[2].output_ids)
    await end(client, key)

    assert_tool_round_trip(await result(client, rollout_id), llm.calls, use.id)
    # The policy saw the tool results and the system prompt, rendered by its template.
    last_prompt = llm.tok.decode(llm.calls[2].prompt_ids)
    assert "You are a calculator." in last_prompt and "done" in last_prompt
    # The key died with its rollout: a 401 in Anthropic's error shape.
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await harness.messages.create(model="p", max_tokens=16, messages=messages)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "authentication_error"


async def test_malformed_tool_call_is_answered_as_text(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="x")
    key, harness = await anthropic_for(client, rollout_id)
    reply = await harness.messages.create(
        model="policy",
        max_tokens=256,
        tools=[BASH],
        messages=[{"role": "user", "content": "Run something. [script:malformed]"}],
    )
    assert reply.stop_reason == "end_turn"
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == policy([], "[script:malformed]")
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["turns"][0]["tool_calls"] == [] and done["reward"] == 0.0
    assert done["trajectory"]["tokens"]["input_ids"] == llm.calls[0].prompt_ids + llm.calls[0].output_ids


async def test_max_tokens_only_lowers_and_a_cut_reply_stops_at_max_tokens(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="x")
    key, harness = await anthropic_for(client, rollout_id)
    reply = await harness.messages.create(
        model="p", max_tokens=2, messages=[{"role": "user", "content": "[script:cut]"}]
    )
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 2
    assert max_tokens(llm.calls[0]) == 2
    await harness.messages.create(model="p", max_tokens=100_000, messages=[{"role": "user", "content": "[script:big]"}])
    assert max_tokens(llm.calls[1]) == 64  # the trainer's, not the harness's
    await end(client, key)


async def test_bad_requests_are_400s_naming_the_field_in_anthropics_shape(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="none")
    key, _ = await anthropic_for(client, rollout_id)
    url = f"/v1/gateway/{key}/v1/messages"
    user = {"role": "user", "content": "x"}
    cases = [
        ({"messages": [user]}, "max_tokens"),
        ({"max_tokens": 0, "messages": [user]}, "max_tokens"),
        ({"max_tokens": 8, "messages": []}, "messages"),
        ({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}
                ],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [user, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}],
            },
            "messages[1].content[0]",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    user,
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": "ls"}]},
                ],
            },
            "messages[1].content[0].input",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"max_tokens": 8, "messages": [user], "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"max_tokens": 8, "messages": [user], "tools": [{"name": "t"}]}, "tools[0].input_schema"),
        ({"max_tokens": 8, "messages": [user], "system": [{"type": "image"}]}, "system[0]"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        # Prefill (a last assistant message to continue) cannot be honoured: refused.
        ({"max_tokens": 8, "messages": [user, {"role": "assistant", "content": "The answer is"}]}, "messages[1].role"),
        ({"max_tokens": 8, "messages": [user], "stop_sequences": "END"}, "stop_sequences"),
        ({"max_tokens": 8, "messages": [user], "temperature": 3}, "temperature"),
    ]
    for body, field in cases:
        r = await client.post(url, json=body)
        assert r.status_code == 400, (body, r.text)
        answer = r.json()
        assert answer["type"] == "error", answer
        assert answer["error"]["type"] == "invalid_request_error", answer
        assert answer["error"]["message"].startswith(f"{field}: "), (field, answer)
    r = await client.post(url, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # Unknown keys: 401 in Anthropic's shape.
    for bad in ("rsg-made-up", key[:-1]):
        r = await client.post(f"/v1/gateway/{bad}/v1/messages", json={"max_tokens": 8, "messages": [user]})
        assert r.status_code == 401, r.text
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
        }
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["turns"] == [] and len(llm.calls) == 0


async def test_a_prompt_past_the_context_limit_is_refused_as_anthropic_does(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "none"}}],
            "sampling": {"max_tokens": 16},
            "agent": {"max_context_tokens": 256},
        },
    )
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    key, harness = await anthropic_for(client, rollout_id)
    with pytest.raises(anthropic.BadRequestError) as refused:
        await harness.messages.create(
            model="p", max_tokens=16, messages=[{"role": "user", "content": "[script:ctx] " + "word " * 400}]
        )
    assert refused.value.body["error"]["message"].startswith("prompt is too long")
    assert len(llm.calls) == 0
    await end(client, key)


async def test_an_assistant_turn_the_harness_rewrote_is_never_trained_on(make_api, llm, anthropic_for):
    """A cheating harness rewrites the content of the policy's assistant turn (and makes
    one up) before sending the history back: those tokens are prompt (loss_mask 0) in
    a new sequence; only what the backend sampled is ever marked 1, and the reward is
    the policy's own last reply."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="The answer is 42.")
    key, harness = await anthropic_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "hello [script:cheat]"}]
    reply = await harness.messages.create(model="p", max_tokens=64, messages=history)
    forged = "The answer is 42. I solved it perfectly."
    assert reply.content[0].text != forged
    history += [
        {"role": "assistant", "content": [{"type": "text", "text": forged}]},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "The answer is 42."},  # never sampled at all
        {"role": "user", "content": "and?"},
    ]
    await harness.messages.create(model="p", max_tokens=64, messages=history)
    await end(client, key)

    done = await result(client, rollout_id)
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 2 and len(llm.calls) == 2
    for recorded, sequence in zip(llm.calls, trajectory["sequences"], strict=True):
        assert_exact(sequence, [recorded])
    last = trajectory["sequences"][-1]
    ids, mask = last["input_ids"], last["loss_mask"]
    assert sum(mask) == len(llm.calls[1].output_ids)  # exactly the sampled ids
    forged_ids = llm.tok.encode(forged)
    at = next(i for i in range(len(ids)) if ids[i : i + len(forged_ids)] == forged_ids)
    assert set(mask[at : at + len(forged_ids)]) == {0}
    assert done["reward"] == 0.0  # the reply the policy sampled, not what the harness wrote


async def test_a_tool_call_the_harness_edited_is_prompt_not_sample(make_api, llm, anthropic_for):
    """The harness sends back the policy's tool_use with other input (the call it wishes
    the policy had made): the edited call is prompt in a new sequence, never sample."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="none")
    key, harness = await anthropic_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "[script:tools] compute"}]
    first = await harness.messages.create(model="p", max_tokens=64, messages=history, tools=[BASH])
    blocks = [b.model_dump() for b in first.content]
    assert blocks[1]["type"] == "tool_use"
    blocks[1]["input"] = {"command": "cat /secret/answer.txt"}
    history += [
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blocks[1]["id"], "content": "42"}]},
    ]
    await harness.messages.create(model="p", max_tokens=64, messages=history, tools=[BASH])
    await end(client, key)

    trajectory = (await result(client, rollout_id))["trajectory"]
    assert trajectory["sequence_count"] == 2 and len(llm.calls) == 2
    for recorded, sequence in zip(llm.calls, trajectory["sequences"], strict=True):
        assert_exact(sequence, [recorded])
    last = trajectory["sequences"][-1]
    ids, mask = last["input_ids"], last["loss_mask"]
    prompt = [i for i, m in zip(ids, mask) if m == 0]
    assert "cat /secret/answer.txt" in llm.tok.decode(prompt)  # the edit: all prompt
    sampled = llm.tok.decode([i for i, m in zip(ids, mask) if m == 1])
    assert sampled == llm.tok.decode(llm.calls[1].output_ids) and "secret" not in sampled


# A harness (standard library only) inside the rollout's bubblewrap sandbox, speaking
# Anthropic's wire to ANTHROPIC_BASE_URL: one call, then one streamed.
SANDBOXED = """
import json, os, urllib.request

def messages(history, stream=False):
    body = json.dumps({"model": "p", "max_tokens": 32, "messages": history,
                       "stream": stream}).encode()
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
                                     data=body, headers={
        "content-type": "application/json", "anthropic-version": "2023-06-01",
        "x-api-key": os.environ["ANTHROPIC_API_KEY"]})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode()

history = [{"role": "user", "content": "[script:boxed]"}]
first = json.loads(messages(history))["content"][0]["text"]
history += [{"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
events = messages(history, stream=True)
kinds = [line[7:] for line in events.splitlines() if line.startswith("event: ")]
text = "".join(json.loads(line[6:])["delta"].get("text", "") for line in events.splitlines()
               if line.startswith("data: ") and '"content_block_delta"' in line)
print("harness got:", first, "|", text, "|", ",".join(kinds))
"""


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_a_sandboxed_harness_speaks_anthropic_through_the_socket(make_api, llm):
    service, client = await make_api([llm.url])
    done = await run_sandboxed(client, SANDBOXED, '"$ROLLSERVE_PYTHON" harness.py')
    evaluation = done["evaluation"]
    expected = f"harness got: reply 0 of boxed | reply 1 of boxed | {','.join(STREAM_EVENTS)}"
    assert expected in evaluation["harness_log_tail"]
    assert done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 1 and len(llm.calls) == 2
    assert_exact(trajectory["tokens"], llm.calls)

"""What Claude Code sends on Anthropic's wire, through the HTTP API with the official
``anthropic`` client: thinking config, mid-conversation system messages, cache_control,
metadata and context edits taken; what cannot be honoured refused naming the field;
``count_tokens`` the policy tokenizer's exact count; auxiliary calls (another model
than the main loop's) recorded in sequences of their own with their purpose and model,
never in the main loop's, never graded."""

from __future__ import annotations

import shlex

import httpx
import pytest

from rollserve.agent.gateway.bounds import COUNTS_PER_TURN
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_anthropic_api import BASH, call
from tests.e2e.test_gateway_api import TAG, assert_exact, end, result
from tests.e2e.test_gateway_api import harness_for as openai_harness_for

MAIN = "rollserve-policy"
SMALL = "rollserve-small-fast"
CALLS = {"main_model": MAIN, "auxiliary": {SMALL: "small_fast_model"}}
TITLE = "Generate a concise title for this session."


def policy(prompt_ids: list[int], prompt: str) -> str:
    if TITLE in prompt:
        return '{"title": "Compute six times seven"}'
    script = TAG.findall(prompt)[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    if script == "tools":
        return [call("bash", {"command": "echo 6*7"}), "42"][min(turn, 1)]
    return f"reply {turn} of {script}"


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def submit(client: httpx.AsyncClient, answer: str, calls: dict | None = CALLS, max_turns: int = 8) -> str:
    instance: dict = {"answer": answer}
    if calls is not None:
        instance["calls"] = calls
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": instance}],
            "sampling": {"max_tokens": 64},
            "agent": {"max_turns": max_turns},
        },
    )
    assert r.status_code == 202, r.text
    return str(r.json()["groups"][0]["rollout_ids"][0])


def claude_like(messages: list[dict]) -> dict:
    """A request shaped as Claude Code 2.1 sends it (found by running it)."""
    return dict(
        model=MAIN,
        max_tokens=32000,
        messages=messages,
        tools=[BASH],
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.476;"},
            {"type": "text", "text": "You are a calculator.", "cache_control": {"type": "ephemeral"}},
        ],
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        extra_body={
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        },
        extra_headers={
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07"
        },
    )


async def test_claude_codes_requests_are_taken_and_auxiliary_calls_kept_apart(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="42")
    key, harness = await anthropic_for(client, rollout_id)
    messages: list[dict] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is 6*7? [script:tools]", "cache_control": {"type": "ephemeral"}}
            ],
        },
        {"role": "system", "content": "Available agent types: none."},
    ]
    first = await harness.messages.create(**claude_like(messages))
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    # An auxiliary call between the main loop's calls: the small fast model's title.
    title = await harness.messages.create(
        model=SMALL,
        max_tokens=512,
        system=TITLE,
        messages=[{"role": "user", "content": "<session>What is 6*7?</session>"}],
        extra_body={
            "output_config": {
                "format": {
                    "type": "json_schema",
                    "schema": {"type": "object", "properties": {"title": {"type": "string"}}},
                }
            }
        },
    )
    assert title.content[0].text == '{"title": "Compute six times seven"}'
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": "42",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    async with harness.messages.stream(**claude_like(messages)) as stream:
        last = await stream.get_final_message()
    assert last.content[0].text == "42"
    await end(client, key)

    done = await result(client, rollout_id)
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    main = [llm.calls[0], llm.calls[2]]
    # The main loop's sequence is append-only across the auxiliary calls between.
    assert trajectory["sequence_count"] == 1 and len(trajectory["turns"]) == 2
    assert_exact(trajectory["tokens"], main)
    assert [a["purpose"] for a in trajectory["auxiliary"]] == ["small_fast_model"]
    assert [a["model"] for a in trajectory["auxiliary"]] == [SMALL]
    for aux, recorded in zip(trajectory["auxiliary"], llm.calls[1:2], strict=True):
        assert aux["tokens"]["input_ids"] == recorded.prompt_ids + recorded.output_ids
        assert aux["tokens"]["loss_mask"] == [0] * len(recorded.prompt_ids) + [1] * len(recorded.output_ids)
        assert aux["turn"]["logprobs"] == recorded.logprobs
    assert done["stats"]["auxiliary_calls"] == 1 and done["stats"]["gateway_calls"] == 2
    # The mid-conversation system message is rendered where it stands.
    assert "Available agent types: none." in llm.tok.decode(llm.calls[0].prompt_ids)


async def test_an_auxiliary_reply_earns_nothing_and_auxiliary_calls_alone_are_masked(make_api, llm, anthropic_for):
    """A harness (or a policy reaching the gateway through its tools) whose only calls
    ask for another model: no main-loop turn, so nothing is scored (masked), even when
    an auxiliary reply is the answer; auxiliary calls past max_turns are refused."""
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="reply 0 of x", max_turns=2)
    key, harness = await anthropic_for(client, rollout_id)
    for _ in range(2):
        reply = await harness.messages.create(
            model=SMALL, max_tokens=64, messages=[{"role": "user", "content": "[script:x]"}]
        )
        assert reply.content[0].text == "reply 0 of x"
    r = await client.post(
        f"/v1/gateway/{key}/v1/messages",
        json={"model": SMALL, "max_tokens": 8, "messages": [{"role": "user", "content": "[script:x]"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("model: "), r.text
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["mask"] and done["reward"] is None and done["failure"]["kind"] == "infra"
    assert "auxiliary calls" in done["failure"]["message"] and MAIN in done["failure"]["message"]
    assert len(done["trajectory"]["auxiliary"]) == 2 and done["trajectory"]["turns"] == []


async def test_a_model_the_table_does_not_name_is_the_main_loops(make_api, llm, anthropic_for):
    """What is left out of the main loop is the server's choice, never the agent's: a
    policy whose commands reach the gateway and ask for a model of their own name get
    main-loop calls (counted against max_turns, in the trained tokens), not untrained
    auxiliary ones."""
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="reply 1 of x", max_turns=2)
    key, harness = await anthropic_for(client, rollout_id)
    for model in ("some-other-model", ""):
        await harness.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "[script:x]"}])
    r = await client.post(
        f"/v1/gateway/{key}/v1/messages",
        json={"model": "yet-another", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code in (401, 404), r.text  # max_turns main-loop calls: the session ended
    done = await result(client, rollout_id)
    assert done["trajectory"]["auxiliary"] == [] and len(done["trajectory"]["turns"]) == 2
    assert done["stats"]["gateway_calls"] == 2 and done["stats"]["auxiliary_calls"] == 0
    assert not done["mask"] and done["reward"] is not None  # scored, on the main loop


async def test_count_tokens_is_the_policy_tokenizers_exact_count(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="reply 0 of count")
    key, harness = await anthropic_for(client, rollout_id)
    request = {
        "model": MAIN,
        "system": "Be brief.",
        "tools": [BASH],
        "messages": [{"role": "user", "content": "Count me. [script:count]"}],
    }
    counted = await harness.messages.count_tokens(**request)
    assert len(llm.calls) == 0  # nothing sampled
    reply = await harness.messages.create(max_tokens=64, **request)
    assert counted.input_tokens == reply.usage.input_tokens == len(llm.calls[0].prompt_ids)
    r = await client.post(
        f"/v1/gateway/{key}/v1/messages/count_tokens",
        json={"messages": [{"role": "user", "content": [{"type": "image"}]}]},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages[0].content[0]: ")
    await end(client, key)
    done = await result(client, rollout_id)
    assert len(done["trajectory"]["turns"]) == 1 and done["reward"] == 1.0
    r = await client.post(
        f"/v1/gateway/{key}/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


async def test_count_tokens_is_bounded_per_session(make_api, llm, anthropic_for):
    """Each count renders and tokenizes a whole request on the server: an agent's
    commands looping on it get 400s past COUNTS_PER_TURN per turn of max_turns."""
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="reply 0 of count", max_turns=2)
    key, harness = await anthropic_for(client, rollout_id)
    request = {"model": MAIN, "messages": [{"role": "user", "content": "Count me."}]}
    for _ in range(COUNTS_PER_TURN * 2):
        await harness.messages.count_tokens(**request)
    r = await client.post(f"/v1/gateway/{key}/v1/messages/count_tokens", json=request)
    assert r.status_code == 400 and "counted tokens" in r.json()["error"]["message"], r.text
    assert len(llm.calls) == 0  # nothing sampled
    await end(client, key)


async def test_what_cannot_be_honoured_is_refused_naming_the_field(make_api, llm, anthropic_for):
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="none", calls=None)
    key, _ = await anthropic_for(client, rollout_id)
    user = {"role": "user", "content": "x"}
    cases = [
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"tool_choice": {"type": "any"}, "tools": [BASH]}, "tool_choice.type"),
        ({"tool_choice": {"type": "tool", "name": "bash"}, "tools": [BASH]}, "tool_choice.type"),
        # One validator for every wire: "none" while tools are offered constrains the sample.
        ({"tool_choice": {"type": "none"}, "tools": [BASH]}, "tool_choice.type"),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management.edits[0].type"),
        ({"mcp_servers": [{"type": "url", "url": "https://example.com", "name": "x"}]}, "mcp_servers"),
        ({"container": "container_1"}, "container"),
        (
            {
                "messages": [
                    user,
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                    user,
                ]
            },
            "messages[1].content[0]",
        ),
        (
            {"messages": [user, {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}, user]},
            "messages[1].content[0]",
        ),
        ({"messages": [user, {"role": "system", "content": [{"type": "image"}]}]}, "messages[1].content[0]"),
    ]
    for extra, field in cases:
        body = {"max_tokens": 8, "messages": [user], **extra}
        r = await client.post(f"/v1/gateway/{key}/v1/messages", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"].startswith(f"{field}: "), (field, r.json())
    assert len(llm.calls) == 0
    # Thinking disabled or enabled with a budget is taken (not acted on).
    for thinking in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 2048}):
        r = await client.post(
            f"/v1/gateway/{key}/v1/messages",
            json={
                "max_tokens": 8,
                "thinking": thinking,
                "tool_choice": {"type": "auto"},
                "messages": [{"role": "user", "content": "[script:think]"}],
            },
        )
        assert r.status_code == 200, r.text
        assert [b["type"] for b in r.json()["content"]] == ["text"]  # never a thinking block
    await end(client, key)


async def test_calls_in_an_instance_are_checked_at_submit(make_api, llm):
    service, client = await make_api([llm.url])
    for calls, field in [
        ({"auxiliary": {SMALL: "title"}}, "instance.calls"),
        ({"main_model": MAIN, "auxiliary": {MAIN: "title"}}, "instance.calls"),
        ({"main_model": MAIN, "auxiliary": {SMALL: "Not Snake"}}, "instance.calls"),
        ({"main_model": "", "auxiliary": {}}, "instance.calls.main_model"),
        ({"main_model": MAIN, "extra": 1}, "instance.calls.extra"),
    ]:
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "gateway", "instance": {"answer": "x", "calls": calls}}]}
        )
        assert r.status_code == 422, r.text
        assert field in r.text, (field, r.text)


async def test_the_openai_wire_keeps_auxiliary_calls_apart_too(make_api, llm):
    """The accounting is the session's, whatever the wire: OpenAI Chat Completions."""
    service, client = await make_api([llm.url])
    rollout_id = await submit(client, answer="reply 1 of chat")
    key, harness = await openai_harness_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "[script:chat]"}]
    first = await harness.chat.completions.create(model=MAIN, messages=history)
    aux = await harness.chat.completions.create(
        model=SMALL, messages=[{"role": "system", "content": TITLE}, {"role": "user", "content": "[script:chat]"}]
    )
    assert aux.choices[0].message.content == '{"title": "Compute six times seven"}'
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    await harness.chat.completions.create(model=MAIN, messages=history)
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["reward"] == 1.0 and done["trajectory"]["sequence_count"] == 1
    assert_exact(done["trajectory"]["tokens"], [llm.calls[0], llm.calls[2]])
    (recorded,) = done["trajectory"]["auxiliary"]
    assert (recorded["purpose"], recorded["model"]) == ("small_fast_model", SMALL)
    assert recorded["tokens"]["input_ids"] == llm.calls[1].prompt_ids + llm.calls[1].output_ids


# A harness (standard library only) in the rollout's sandbox: count_tokens, a main-loop
# call and a small-fast-model call through the socket, as Claude Code would make them.
SANDBOXED = """
import json, os, sys, urllib.request

MAIN, SMALL, TITLE = sys.argv[1:]

def post(path, body):
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + path,
                                     data=json.dumps(body).encode(), headers={
        "content-type": "application/json", "x-api-key": os.environ["ANTHROPIC_API_KEY"]})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())

messages = [{"role": "user", "content": "[script:boxed]"}]
counted = post("/v1/messages/count_tokens", {"model": MAIN, "messages": messages})
main = post("/v1/messages?beta=true", {"model": MAIN, "max_tokens": 32, "messages": messages})
title = post("/v1/messages", {"model": SMALL, "max_tokens": 32, "system": TITLE,
                              "messages": messages})
print("harness got:", counted["input_tokens"], main["usage"]["input_tokens"],
      main["content"][0]["text"], "|", title["content"][0]["text"])
"""


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_a_sandboxed_harness_counts_tokens_and_makes_auxiliary_calls_through_the_socket(make_api, llm):
    service, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {
                    "data_source": "gateway",
                    "instance": {
                        "answer": "reply 0 of boxed",
                        "files": {"harness.py": SANDBOXED},
                        "calls": CALLS,
                        "command": shlex.join(["harness.py", MAIN, SMALL, TITLE]).join(['"$ROLLSERVE_PYTHON" ', ""]),
                    },
                }
            ],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 8},
        },
    )
    assert r.status_code == 202, r.text
    done = await result(client, r.json()["groups"][0]["rollout_ids"][0])
    evaluation = done["evaluation"]
    assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
    prompt = len(llm.calls[0].prompt_ids)
    assert (f'harness got: {prompt} {prompt} reply 0 of boxed | {{"title": "Compute six times seven"}}') in evaluation[
        "harness_log_tail"
    ]
    assert done["reward"] == 1.0 and not done["mask"] and len(llm.calls) == 2
    assert_exact(done["trajectory"]["tokens"], llm.calls[:1])
    assert [a["model"] for a in done["trajectory"]["auxiliary"]] == [SMALL]

"""The recording gateway through the HTTP API: a scripted harness (the official
``openai`` client) plays the agent, the scripted vLLM double plays the policy, and
every trajectory is checked token for token against the double's log."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.contract import RolloutResult
from rollserve.integrations.tensors import MultiSequenceError, to_sample
from rollserve.testing import FakeVLLM

TAG = re.compile(r"\[script:(\w+)\]")
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def policy(prompt_ids: list[int], prompt: str) -> str:
    """Scripted replies: by the task's tag and how many assistant turns the prompt has."""
    script = TAG.findall(prompt)[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    if script == "tools":
        return [format_tool_call("bash", {"command": "echo 6*7"}), "42"][min(turn, 1)]
    if script == "malformed":
        return 'Let me run it.\n<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>'
    return f"reply {turn} of {script}"


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def submit(client: httpx.AsyncClient, answer: str = "42", n: int = 1, max_turns: int = 8) -> list[str]:
    body = {
        "tasks": [{"data_source": "gateway", "instance": {"answer": answer}, "n": n}],
        "sampling": {"max_tokens": 64},
        "agent": {"max_turns": max_turns},
    }
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    return list(r.json()["groups"][0]["rollout_ids"])


async def harness_for(client: httpx.AsyncClient, rollout_id: str) -> tuple[str, openai.AsyncOpenAI]:
    """The rollout's key, and an OpenAI client pointed at its gateway (over the same
    in-process transport; the API key is anything, as a harness would set it)."""
    r = await client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60})
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["base_url"] == f"/v1/gateway/{info['key']}/v1" and not info["ended"]
    return info["key"], openai.AsyncOpenAI(
        base_url=f"http://rollserve{info['base_url']}", api_key="anything", http_client=client, max_retries=0
    )


async def end(client: httpx.AsyncClient, key: str) -> None:
    r = await client.post(f"/v1/gateway/{key}/end")
    assert r.status_code == 200 and r.json() == {"ended": True}, r.text


async def result(client: httpx.AsyncClient, rollout_id: str) -> dict:
    view = (await client.get(f"/v1/rollouts/{rollout_id}", params={"wait": 120})).json()
    assert view["done"], view
    return dict(view["result"])


def assert_turns_exact(trajectory: dict, calls: list) -> list[dict]:
    """Each turn's sampled ids and logprobs are the backend's, call for call; the turns."""
    turns: list[dict] = trajectory["turns"]
    assert [t["output_ids"] for t in turns] == [c.output_ids for c in calls]
    assert [t["logprobs"] for t in turns] == [c.logprobs for c in calls]
    return turns


def assert_tool_round_trip(done: dict, calls: list, call_id: str) -> str:
    """A harness's bash call answered and the final reply: completed with reward 1, one
    append-only sequence token-exact against the backend's three calls, the tool call
    recorded with its id, the deltas the template's own; the last prompt, decoded."""
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 1 and len(calls) == 3  # append-only throughout
    assert_exact(trajectory["tokens"], calls)
    turns = assert_turns_exact(trajectory, calls)
    assert turns[0]["tool_calls"] == [{"name": "bash", "arguments": {"command": "echo 6*7"}, "id": call_id}]
    assert trajectory["fidelity"]["fallback_deltas"] == 0  # the deltas were the template's own
    return calls[2].prompt_ids


def assert_exact(sequence: dict, calls: list) -> None:
    """``sequence`` is exactly the last call's prompt and sample, each earlier call's
    prompt+sample a prefix of the next one's prompt, and loss_mask 1 exactly on the
    ids the backend sampled, with their logprobs verbatim."""
    for earlier, later in zip(calls, calls[1:]):
        done = earlier.prompt_ids + earlier.output_ids
        assert later.prompt_ids[: len(done)] == done
    last = calls[-1]
    assert sequence["input_ids"] == last.prompt_ids + last.output_ids
    mask = [0] * len(last.prompt_ids) + [1] * len(last.output_ids)
    logprobs = [0.0] * len(last.prompt_ids) + list(last.logprobs)
    for call in calls[:-1]:
        start = len(call.prompt_ids)
        mask[start : start + len(call.output_ids)] = [1] * len(call.output_ids)
        logprobs[start : start + len(call.output_ids)] = call.logprobs
    assert sequence["loss_mask"] == mask
    assert sequence["logprobs"] == logprobs


async def test_openai_client_with_tools_streaming_and_not_is_token_exact(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, harness = await harness_for(client, rollout_id)
    messages: list[dict] = [
        {"role": "system", "content": "You are a calculator. [script:tools]"},
        {"role": "user", "content": "What is 6*7?"},
    ]
    first = await harness.chat.completions.create(model="policy", messages=messages, tools=[BASH])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "bash" and call.function.arguments == '{"command": "echo 6*7"}'
    assert first.usage is not None and first.usage.completion_tokens == len(llm.calls[0].output_ids)
    # The harness sends back the message as the client gave it (refusal, annotations...).
    messages += [
        choice.message.model_dump(exclude_unset=False),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    stream = await harness.chat.completions.create(
        model="policy", messages=messages, tools=[BASH], stream=True, stream_options={"include_usage": True}
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for part in chunk.choices:
            text += part.delta.content or ""
            finish = part.finish_reason or finish
    assert (text, finish) == ("42", "stop")
    assert usage is not None and usage.prompt_tokens == len(llm.calls[1].prompt_ids)
    await end(client, key)

    done = await result(client, rollout_id)
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 1 and trajectory["sequences"] == []
    assert trajectory["ended_by"] == "finished" and len(llm.calls) == 2
    assert_exact(trajectory["tokens"], llm.calls)
    turns = assert_turns_exact(trajectory, llm.calls)
    assert turns[0]["tool_calls"] == [{"name": "bash", "arguments": {"command": "echo 6*7"}, "id": call.id}]
    assert trajectory["fidelity"]["fallback_deltas"] == 0  # the delta was the template's own
    assert done["stats"]["gateway_calls"] == 2
    sample = to_sample(RolloutResult.model_validate(done), filler_id=0)
    assert sample.prompt_ids + sample.completion_ids == trajectory["tokens"]["input_ids"]
    # The key died with its rollout.
    r = await client.post(f"/v1/gateway/{key}/v1/chat/completions", json={"model": "p", "messages": messages})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_malformed_tool_call_is_text_as_vllm_answers_it(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="x")
    key, harness = await harness_for(client, rollout_id)
    reply = await harness.chat.completions.create(
        model="policy", tools=[BASH], messages=[{"role": "user", "content": "Run something. [script:malformed]"}]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == policy([], "[script:malformed]")
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["turns"][0]["tool_calls"] == [] and done["reward"] == 0.0


async def test_truncated_history_becomes_a_second_sequence_each_exact(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="reply 1 of trunc")
    key, harness = await harness_for(client, rollout_id)
    system = {"role": "system", "content": "[script:trunc]"}
    history: list[dict] = [system, {"role": "user", "content": "first question"}]
    for question in ("second question", "third question"):
        reply = await harness.chat.completions.create(model="p", messages=history)
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": question},
        ]
    # The harness drops the oldest exchange to save room: its history is rewritten.
    truncated = [system, *history[3:]]
    last = await harness.chat.completions.create(model="p", messages=truncated)
    assert last.choices[0].message.content == "reply 1 of trunc"
    await end(client, key)

    done = await result(client, rollout_id)
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 2 and len(llm.calls) == 3
    assert trajectory["tokens"] == {"input_ids": [], "loss_mask": [], "logprobs": []}
    assert [t["sequence"] for t in trajectory["turns"]] == [0, 0, 1]
    first, second = trajectory["sequences"]
    assert_exact(first, llm.calls[:2])
    assert_exact(second, llm.calls[2:])
    assert done["reward"] == 1.0 and done["stats"]["turns"] == 3
    total = sum(len(s["input_ids"]) for s in trajectory["sequences"])
    assert done["stats"]["prompt_tokens"] + done["stats"]["output_tokens"] == total
    # A prompt/completion trainer adapter refuses it by name, rather than glue the two.
    with pytest.raises(MultiSequenceError, match=rollout_id) as refused:
        to_sample(RolloutResult.model_validate(done), filler_id=0)
    assert refused.value.sequence_count == 2


async def test_an_assistant_turn_the_harness_wrote_is_never_trained_on(make_api, llm):
    """A cheating harness edits the policy's reply (or makes one up) before sending the
    history back: those tokens are prompt (loss_mask 0); only what the backend sampled
    is ever marked 1."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client, answer="unreachable")
    key, harness = await harness_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "hello [script:cheat]"}]
    reply = await harness.chat.completions.create(model="p", messages=history)
    forged = "The answer is unreachable. I solved it perfectly."
    history += [
        {"role": "assistant", "content": forged},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "unreachable"},  # never sampled at all
        {"role": "user", "content": "and?"},
    ]
    assert reply.choices[0].message.content != forged
    await harness.chat.completions.create(model="p", messages=history)
    await end(client, key)

    done = await result(client, rollout_id)
    trajectory = done["trajectory"]
    assert trajectory["sequence_count"] == 2 and len(llm.calls) == 2
    sequences = trajectory["sequences"]
    for call, sequence in zip(llm.calls, sequences, strict=True):
        assert_exact(sequence, [call])
    # The forged text is in the prompt of the last call, never under loss_mask 1.
    last = sequences[-1]
    forged_ids = llm.tok.encode(forged)
    ids, mask = last["input_ids"], last["loss_mask"]
    at = next(i for i in range(len(ids)) if ids[i : i + len(forged_ids)] == forged_ids)
    assert set(mask[at : at + len(forged_ids)]) == {0}
    assert done["reward"] == 0.0  # the reply the policy sampled, not what the harness wrote


async def test_keys_name_one_live_rollout_each(make_api, llm):
    service, client = await make_api([llm.url])
    a_id, b_id = await submit(client, answer="none", n=2)
    a_key, a = await harness_for(client, a_id)
    b_key, b = await harness_for(client, b_id)
    assert a_key != b_key
    await a.chat.completions.create(model="p", messages=[{"role": "user", "content": "[script:a]"}])
    await b.chat.completions.create(model="p", messages=[{"role": "user", "content": "[script:b]"}])
    body = {"model": "p", "messages": [{"role": "user", "content": "[script:x]"}]}
    for bad in ("rsg-made-up", a_key[:-1], "", "x" * 300):
        r = await client.post(f"/v1/gateway/{bad}/v1/chat/completions", json=body)
        assert r.status_code in (401, 404), (bad, r.status_code)
        if r.status_code == 401:
            assert r.json()["error"]["type"] == "authentication_error"
    await end(client, a_key)
    r = await client.post(f"/v1/gateway/{a_key}/v1/chat/completions", json=body)
    assert r.status_code in (401, 404) and "error" in r.json()
    await end(client, b_key)
    done_a, done_b = await result(client, a_id), await result(client, b_id)
    assert len(done_a["trajectory"]["turns"]) == len(done_b["trajectory"]["turns"]) == 1
    (call_a,) = [c for c in llm.calls if "[script:a]" in llm.tok.decode(c.prompt_ids)]
    (call_b,) = [c for c in llm.calls if "[script:b]" in llm.tok.decode(c.prompt_ids)]
    assert done_a["trajectory"]["tokens"]["input_ids"] == call_a.prompt_ids + call_a.output_ids
    assert done_b["trajectory"]["tokens"]["input_ids"] == call_b.prompt_ids + call_b.output_ids


async def test_bad_requests_are_400s_naming_the_field(make_api, llm):
    service, client = await make_api(
        [llm.url],
    )
    (rollout_id,) = await submit(client, answer="none")
    key, _ = await harness_for(client, rollout_id)
    url = f"/v1/gateway/{key}/v1/chat/completions"
    cases = [
        ({"model": "p"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ]
    for body, param in cases:
        r = await client.post(url, json=body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    r = await client.post(url, content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    # The task itself is checked at submission: a 422 naming the field.
    for instance, field in (
        ({"answer": ""}, "instance.answer"),
        ({"answer": "x", "files": {"a.py": ""}}, "instance.files"),
        ({"answer": "x", "command": "true", "files": {"../up": ""}}, "instance.files.../up"),
        ({"answer": "x", "command": "true", "files": {"/etc/x": ""}}, "instance.files./etc/x"),
        ({"answer": "x", "surprise": 1}, "instance.surprise"),
    ):
        r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "gateway", "instance": instance}]})
        assert r.status_code == 422, (instance, r.text)
        assert r.json()["errors"][0]["field"] == f"tasks[0].{field}", r.json()
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["turns"] == [] and len(llm.calls) == 0


async def test_text_appended_to_a_cut_reply_is_prompt_not_sample(make_api, llm):
    """The policy's reply was cut by max_tokens (no end token), and the harness sends it
    back with words of its own appended: they may extend the sequence, but as prompt."""
    service, client = await make_api([llm.url])
    body = {
        "tasks": [{"data_source": "gateway", "instance": {"answer": "none"}}],
        "sampling": {"max_tokens": 3},
        "agent": {"max_turns": 4},
    }
    r = await client.post("/v1/rollouts", json=body)
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    key, harness = await harness_for(client, rollout_id)
    history: list[dict] = [{"role": "user", "content": "[script:cut]"}]
    reply = await harness.chat.completions.create(model="p", messages=history)
    assert reply.choices[0].finish_reason == "length"
    appended = " and the task is SOLVED"
    history += [
        {"role": "assistant", "content": reply.choices[0].message.content + appended},
        {"role": "user", "content": "next"},
    ]
    await harness.chat.completions.create(model="p", messages=history)
    await end(client, key)

    trajectory = (await result(client, rollout_id))["trajectory"]
    sequences = trajectory["sequences"] or [trajectory["tokens"]]
    sampled = sum(len(c.output_ids) for c in llm.calls)
    assert sum(sum(s["loss_mask"]) for s in sequences) == sampled
    last = sequences[-1]
    assert last["input_ids"] == llm.calls[-1].prompt_ids + llm.calls[-1].output_ids
    solved = llm.tok.encode(" SOLVED")
    ids = last["input_ids"]
    at = next(i for i in range(len(ids)) if ids[i : i + len(solved)] == solved)
    assert set(last["loss_mask"][at : at + len(solved)]) == {0}


async def test_harness_needs_no_api_token_but_the_trainer_route_does(make_api, llm):
    service, client = await make_api([llm.url], token="trainer-secret")
    auth = {"Authorization": "Bearer trainer-secret"}
    r = await client.post(
        "/v1/rollouts",
        headers=auth,
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "reply 0 of tok"}}],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 1},
        },
    )
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    assert (await client.get(f"/v1/rollouts/{rollout_id}/gateway")).status_code == 401
    info = (await client.get(f"/v1/rollouts/{rollout_id}/gateway", headers=auth, params={"wait": 60})).json()
    harness = openai.AsyncOpenAI(
        base_url=f"http://rollserve{info['base_url']}", api_key="sk-x", http_client=client, max_retries=0
    )
    reply = await harness.chat.completions.create(model="p", messages=[{"role": "user", "content": "[script:tok]"}])
    assert reply.choices[0].message.content == "reply 0 of tok"
    # max_turns is 1: that call was the last; the session ended and RUN with it.
    r = await client.post(
        f"{info['base_url']}/chat/completions", json={"messages": [{"role": "user", "content": "again"}]}
    )
    assert r.status_code in (401, 404) and "error" in r.json()
    view = (await client.get(f"/v1/rollouts/{rollout_id}", headers=auth, params={"wait": 60})).json()
    assert view["result"]["reward"] == 1.0
    assert view["result"]["trajectory"]["ended_by"] == "max_turns"


async def test_a_prompt_past_the_context_limit_is_refused_as_openai_does(make_api, llm):
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
    key, harness = await harness_for(client, rollout_id)
    short = [{"role": "user", "content": "[script:ctx]"}]
    await harness.chat.completions.create(model="p", messages=short)
    long = short + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "word " * 400}]
    with pytest.raises(openai.BadRequestError) as refused:
        await harness.chat.completions.create(model="p", messages=long)
    assert refused.value.code == "context_length_exceeded" and len(llm.calls) == 1
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["trajectory"]["ended_by"] == "context_exhausted" and not done["mask"]
    assert len(done["trajectory"]["turns"]) == 1 and done["stats"]["context_refusals"] == 1


async def test_a_harness_that_stalls_is_ended_at_the_time_limit_and_scored(make_api, llm):
    """The harness took the time (not the backend): the episode ends ``time_limit`` and
    is scored, as the agent loop's own episodes are; a stall cannot buy a mask."""
    service, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "reply 0 of stall"}}],
            "sampling": {"max_tokens": 16},
            "timeouts": {"run": 8, "run_margin": 3},
        },
    )
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    key, harness = await harness_for(client, rollout_id)
    await harness.chat.completions.create(model="p", messages=[{"role": "user", "content": "[script:stall]"}])
    done = await result(client, rollout_id)  # the harness never says it is done
    assert done["status"] == "completed" and not done["mask"], done["failure"]
    assert done["trajectory"]["ended_by"] == "time_limit" and done["reward"] == 1.0
    r = await client.post(
        f"/v1/gateway/{key}/v1/chat/completions", json={"messages": [{"role": "user", "content": "late"}]}
    )
    assert r.status_code == 401 and len(llm.calls) == 1

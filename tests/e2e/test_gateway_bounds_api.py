"""What a gateway call may cost the server before anything is sampled, through the
HTTP API: the key is checked before a byte of the body is read (a made-up key costs
nothing), a session's calls are admitted before their bodies are read, a body is
bounded by the session's context window, a prompt whose bytes prove it past the
context window is refused without being tokenized, and a body past
``bounds.INLINE_BYTES`` is parsed off the event loop (the server keeps answering
meanwhile).

No assertion measures time: each says what happened before what. Bodies that "never
complete" are request streams that wait on an event the test sets only at its end;
a server that read them would not answer within the bound, and the test fails."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rollserve.agent.gateway import wire
from rollserve.agent.gateway.bounds import (
    BODY_SLACK,
    INLINE_BYTES,
    JSON_BYTES_PER_BYTE,
    MAX_WAITING_CALLS,
)
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import end, harness_for, policy, result, submit
from tests.waiting import eventually

BOUND = 60  # seconds any one step may take on a loaded machine


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


class Stalled:
    """A request body that sends ``head`` and then nothing until ``release`` (then it
    ends, unfinished: not JSON)."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.release = asyncio.Event()
        self.started = False  # the server asked for its first chunk
        self.read_past_head = False

    async def __aiter__(self):
        self.started = True
        yield self.head
        await self.release.wait()
        self.read_past_head = True


async def post_stalled(client, path: str, body: Stalled, length: int | None = None):
    headers = {"Content-Type": "application/json"}
    if length is not None:
        headers["Content-Length"] = str(length)
    return await asyncio.wait_for(client.post(path, content=body, headers=headers), BOUND)


async def test_a_made_up_key_is_401_before_its_body_is_read(make_api):
    _, client = await make_api()
    stalled = Stalled(b'{"model": "p", "messages": [')
    try:
        for path in ("/v1/gateway/rsg-made-up/v1/chat/completions", "/v1/gateway/rsg-made-up/v1/messages"):
            r = await post_stalled(client, path, stalled)
            assert r.status_code == 401, r.text
            error = r.json()["error"]  # (OpenAI's shape, or Anthropic's)
            assert "invalid_api_key" in (error.get("code"), error["type"]) or error["type"] == "authentication_error", (
                error
            )
        # A malformed body under a bogus key: the key is what is wrong (never a 400).
        r = await client.post("/v1/gateway/rsg-made-up/v1/chat/completions", content=b"{not json")
        assert r.status_code == 401, r.text
        assert not stalled.read_past_head
    finally:
        stalled.release.set()


async def test_a_body_past_the_context_bound_is_413_before_it_is_read(make_api, llm):
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    session = service.gateways.session(key)
    limit = session.max_body_bytes
    token_bytes = service.tokenizer.max_token_bytes
    assert token_bytes is not None
    # From the context window (gateway's default: 8192 tokens), never above 8 MiB.
    assert limit == min(8 << 20, JSON_BYTES_PER_BYTE * token_bytes * 8192 + BODY_SLACK)
    stalled = Stalled(b'{"model": "p", "messages": [')
    try:
        r = await post_stalled(client, f"/v1/gateway/{key}/v1/chat/completions", stalled, length=limit + 1)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large"
        assert not stalled.read_past_head
    finally:
        stalled.release.set()
    # Without a Content-Length, it is refused as soon as the bound is passed.
    message = {"role": "user", "content": "x" * (limit // 2)}
    body = json.dumps({"model": "p", "messages": [message, message, message]}).encode()

    async def chunks():
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    r = await client.post(f"/v1/gateway/{key}/v1/chat/completions", content=chunks())
    assert r.status_code == 413, r.text
    # The session still answers a call of a fitting size.
    r = await client.post(
        f"/v1/gateway/{key}/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "hi [script:x]"}]},
    )
    assert r.status_code == 200, r.text
    await end(client, key)


async def test_a_streamed_body_past_the_servers_own_limit_is_the_wires_413(make_api, llm):
    """The server's --max-request-mb below the session's bound: a body streamed past it
    (no Content-Length) is a 413 in the harness's wire's shape, naming that limit,
    and the session goes on answering."""
    service, client = await make_api([llm.url], server={"limits": {"max_request_bytes": 100_000}})
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    assert service.gateways.session(key).max_body_bytes > 100_000
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "x" * 150_000}]})

    async def chunks():
        for start in range(0, len(body), 16384):
            yield body[start : start + 16384].encode()

    for route in ("chat/completions", "messages"):  # OpenAI's error shape, Anthropic's
        r = await client.post(f"/v1/gateway/{key}/v1/{route}", content=chunks())
        assert r.status_code == 413, r.text
        assert "larger than the server's limit of 100000 bytes" in r.json()["error"]["message"]
    r = await client.post(
        f"/v1/gateway/{key}/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "hi [script:x]"}]},
    )
    assert r.status_code == 200, r.text
    # A method a harness path does not take goes on to the app: its 404/405, never a 500.
    r = await client.get(f"/v1/gateway/{key}/v1/chat/completions")
    assert r.status_code in (404, 405), r.text
    await end(client, key)


async def test_calls_are_admitted_before_their_bodies_are_read(make_api, llm):
    _, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    path = f"/v1/gateway/{key}/v1/chat/completions"
    held = [Stalled(b'{"model": "p", "messages": [') for _ in range(MAX_WAITING_CALLS)]
    calls = [asyncio.create_task(client.post(path, content=body)) for body in held]
    extra = Stalled(b'{"model": "p", "messages": [')
    try:
        await eventually(
            lambda: all(body.started for body in held), timeout=BOUND, what="every held call in (its body being read)"
        )
        refused = await post_stalled(client, path, extra)
        # The 5th call is refused while the others' bodies are still unread: a
        # session never holds more than MAX_WAITING_CALLS bodies.
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_calls"
        assert not extra.read_past_head
    finally:
        for body in [*held, extra]:
            body.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*calls), BOUND)
    assert {a.status_code for a in answers} == {400}  # (their bodies were not chats)
    await end(client, key)


async def test_a_prompt_its_bytes_prove_too_long_is_refused_before_tokenizing(make_api, llm, monkeypatch):
    service, client = await make_api([llm.url])
    tokenizer = service.tokenizer
    token_bytes = tokenizer.max_token_bytes
    encoded: list[int] = []  # the length of every text the tokenizer was given
    real_encode = type(tokenizer).encode

    def spy(self, text: str) -> list[int]:
        encoded.append(len(text))
        return real_encode(self, text)

    monkeypatch.setattr(type(tokenizer), "encode", spy)
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    session = service.gateways.session(key)
    window = 8192  # the gateway's default max_context_tokens
    # Below the body bound, above what 8192 tokens can hold: N bytes a token at most.
    size = token_bytes * window + 1
    assert size + 1000 < session.max_body_bytes
    r = await client.post(
        f"/v1/gateway/{key}/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "y" * size}]},
    )
    assert all(n < size for n in encoded), "the oversized prompt was tokenized"
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in r.json()["error"]["message"], r.json()  # (the proven bound)
    assert llm.calls == []
    # A prompt just under what the bound can prove is tokenized and answered as before.
    r = await client.post(
        f"/v1/gateway/{key}/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "hi [script:x]"}]},
    )
    assert r.status_code == 200, r.text
    await end(client, key)
    done = await result(client, rollout_id)
    assert done["stats"]["context_refusals"] == 1


@pytest.mark.parametrize("route", ["chat/completions", "messages"])
async def test_the_server_answers_while_a_large_body_is_parsed(make_api, llm, monkeypatch, route):
    """A body past INLINE_BYTES (JSON padded with whitespace): its parse is held open
    (on whatever thread runs it) until /healthz has answered: parsed on the event loop,
    /healthz could not answer first."""
    service, client = await make_api([llm.url])
    (rollout_id,) = await submit(client)
    key, _ = await harness_for(client, rollout_id)
    events: list[str] = []
    answered = threading.Event()
    module = (
        wire
        if route == "chat/completions"
        else __import__("rollserve.agent.gateway.anthropic_wire", fromlist=["parse_request"])
    )
    real_parse = module.parse_request

    def held_parse(raw: bytes):
        events.append("parse started")
        answered.wait(BOUND)  # (bounded: on the loop, it would block it this long)
        events.append("parse ended")
        return real_parse(raw)

    monkeypatch.setattr(module, "parse_request", held_parse)
    body = {"model": "p", "messages": [{"role": "user", "content": "hi [script:x]"}]}
    if route == "messages":
        body["max_tokens"] = 16
    raw = json.dumps(body) + " " * INLINE_BYTES  # (whitespace after the value: still JSON)
    call = asyncio.create_task(
        client.post(f"/v1/gateway/{key}/v1/{route}", content=raw, headers={"Content-Type": "application/json"})
    )
    await eventually(lambda: events, timeout=BOUND, what="the parse to start")
    health = await asyncio.wait_for(client.get("/healthz"), BOUND)
    events.append("healthz answered")
    answered.set()
    assert health.status_code == 200
    r = await asyncio.wait_for(call, BOUND)
    assert r.status_code == 200, r.text
    assert events == ["parse started", "healthz answered", "parse ended"]
    await end(client, key)

"""A server backend's bounded connection pool: at most ``max_connections`` sampling
requests at the server at once, the rest waiting in order; health checks and control
calls never wait behind them; a spec's bound is checked, over HTTP too."""

import asyncio

import pytest

from rollserve.llm.backends import backend_from_spec, parse_backend_spec
from rollserve.llm.backends.http import MAX_CONNECTIONS
from rollserve.llm.backends.openai_chat import OpenAIChatBackend
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router, RouterConfig
from rollserve.testing import FakeVLLM
from tests.waiting import eventually


def most_at_once(calls) -> int:
    """The most calls the server held at once (from its own start and finish times)."""
    edges = sorted([(c.started_at, 1) for c in calls] + [(c.finished_at, -1) for c in calls])
    held = peak = 0
    for _, step in edges:
        held += step
        peak = max(peak, held)
    return peak


async def test_sampling_requests_wait_for_one_of_max_connections(tok, chat_prompt):
    async with FakeVLLM(tok, replies="x", latency=0.2) as server:
        backend = VLLMBackend(server.url, model="m", max_connections=2)
        calls = [asyncio.ensure_future(backend.generate(chat_prompt(), SamplingParams(max_tokens=2))) for _ in range(8)]
        await eventually(lambda: backend.http.waiting == 6, timeout=30)
        assert backend.describe()["waiting_for_connection"] == 6
        assert backend.describe()["max_connections"] == 2
        assert backend.describe()["outstanding"] == 8  # in flight: sent or waiting
        gens = await asyncio.gather(*calls)
        await backend.close()
    assert len(gens) == 8 and len(server.calls) == 8
    assert most_at_once(server.calls) == 2
    assert backend.http.waiting == 0


async def test_chat_requests_wait_for_one_of_max_connections_too(tok):
    async with FakeVLLM(tok, replies="x", latency=0.2) as server:
        backend = OpenAIChatBackend(server.url, model="m", max_connections=2)
        messages = [{"role": "user", "content": "2+2?"}]
        calls = [asyncio.ensure_future(backend.chat(messages, SamplingParams(max_tokens=2))) for _ in range(8)]
        await eventually(lambda: backend.http.waiting == 6, timeout=30)
        assert backend.describe()["waiting_for_connection"] == 6
        assert backend.describe()["outstanding"] == 8
        replies = await asyncio.gather(*calls)
        await backend.close()
    chats = [c for c in server.calls if c.route == "/v1/chat/completions"]
    assert len(replies) == 8 and len(chats) == 8
    assert most_at_once(chats) == 2
    assert backend.http.waiting == 0


async def test_the_wait_for_a_slot_is_not_counted_in_attempt_timeout(tok, chat_prompt):
    """A saturated healthy backend is not a hung one: a try queued for a connection slot
    far past ``attempt_timeout`` is neither abandoned nor blamed; once it holds its slot
    the clock runs, and a server that then hangs is abandoned and retried as before."""
    async with FakeVLLM(tok, replies="x") as server:
        backend = VLLMBackend(server.url, name="full", model="m", max_connections=1)
        router = Router(config=RouterConfig(attempt_timeout=0.2, retry_backoff=0.01))
        router.add(backend)
        held = backend.http.sampling_slot()  # the one slot, taken by other traffic
        await held.__aenter__()
        server.fail_next(1, mode="hang")  # the first request that is sent hangs
        call = asyncio.ensure_future(router.session().generate(chat_prompt(), SamplingParams(max_tokens=2)))
        await eventually(lambda: backend.http.waiting == 1, timeout=30)
        done, _ = await asyncio.wait([call], timeout=1.0)  # 5 x attempt_timeout in the queue
        assert not done and backend.http.waiting == 1
        assert router.counters["retries"] == 0 and server.calls == []
        await held.__aexit__(None, None, None)
        gen = await asyncio.wait_for(call, 60)  # sent, hung 0.2 s at the server, tried again
        assert gen.backend == "full" and gen.output_ids == server.calls[-1].output_ids
        assert router.counters["retries"] == 1 and len(server.calls) == 2
        await router.stop()


async def test_a_tokenizer_client_is_unbounded_and_takes_no_slot(tok):
    """A tokenizer's calls are not sampling: no bound for them to queue behind inside
    aiohttp (where the wait would count against their own timeout)."""
    from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer

    tokenizer = BackendTokenizer("http://127.0.0.1:1")
    assert tokenizer.http.max_connections is None
    async with tokenizer.http.sampling_slot():  # passes straight through
        assert tokenizer.http.waiting == 0
        assert tokenizer.http.session().connector.limit == 0  # type: ignore[union-attr]
    await tokenizer.http.close()


async def test_a_health_check_does_not_wait_behind_sampling(tok, chat_prompt):
    async with FakeVLLM(tok, replies="x", latency=60) as server:
        backend = VLLMBackend(server.url, model="m", max_connections=1)
        held = asyncio.ensure_future(backend.generate(chat_prompt(), SamplingParams(max_tokens=2)))
        queued = asyncio.ensure_future(backend.generate(chat_prompt(), SamplingParams(max_tokens=2)))
        await eventually(lambda: len(server.calls) == 1 and backend.http.waiting == 1, timeout=30)
        assert await backend.health() is True  # answered while the one slot is held
        assert not held.done() and not queued.done()
        for call in (held, queued):
            call.cancel()
        await asyncio.gather(held, queued, return_exceptions=True)
        assert backend.http.waiting == 0  # a cancelled wait leaves the queue
        await backend.close()


def test_the_default_bound_and_a_spec_that_sets_it():
    assert VLLMBackend("http://127.0.0.1:1").http.max_connections == MAX_CONNECTIONS
    assert parse_backend_spec("http://127.0.0.1:1").max_connections == MAX_CONNECTIONS
    for kind in ("vllm", "sglang", "llamacpp", "openai_chat"):
        backend = backend_from_spec({"kind": kind, "url": "http://127.0.0.1:1", "max_connections": 7})
        assert backend.http.max_connections == 7, kind  # type: ignore[attr-defined]
    for bad in (0, -1, 65_537, "many"):
        with pytest.raises(ValueError, match="max_connections"):
            parse_backend_spec({"url": "http://127.0.0.1:1", "max_connections": bad})


async def test_the_bound_over_http_and_a_hostile_one(make_api, tok):
    async with FakeVLLM(tok, replies="\\boxed{4}", latency=0.1) as server:
        service, client = await make_api()
        for bad in (0, 10**9, True, "1024"):
            r = await client.post("/v1/llm/backends", json={"url": server.url, "max_connections": bad})
            assert r.status_code == 422, (bad, r.text)
            assert [e["field"] for e in r.json()["errors"]] == ["max_connections"], r.json()
        r = await client.post("/v1/llm/backends", json={"url": server.url, "name": "pooled", "max_connections": 2})
        assert r.status_code == 201, r.text
        body = {
            "tasks": [{"data_source": "math", "n": 6, "instance": {"question": "2+2?", "answer": "4"}}],
            "sampling": {"max_tokens": 8},
        }
        r = await client.post("/v1/rollouts", json=body)
        assert r.status_code == 202, r.text
        ids = r.json()["groups"][0]["rollout_ids"]
        for rid in ids:
            got = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
            assert got["status"] == "completed", got
        listing = (await client.get("/v1/llm/backends")).json()["backends"]
        assert [(b["max_connections"], b["waiting_for_connection"]) for b in listing] == [(2, 0)]
    assert len(server.calls) >= 6 and most_at_once(server.calls) <= 2

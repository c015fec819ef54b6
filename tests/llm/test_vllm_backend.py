"""VLLMBackend against FakeVLLM: ids and logprobs verbatim, errors typed."""

import asyncio

import pytest

from rollserve.errors import ContextWindowError, LLMError
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import LLMBackend, SamplingParams
from rollserve.testing import FakeVLLM


async def test_ids_and_logprobs_are_verbatim(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeVLLM(tok, replies=["The answer is 4."], model="policy") as server:
        backend = VLLMBackend(server.url)
        assert isinstance(backend, LLMBackend)
        gen = await backend.generate(prompt, SamplingParams(max_tokens=64, seed=3))
        await backend.close()
    [call] = server.calls
    assert gen.output_ids == call.output_ids
    assert gen.logprobs == call.logprobs  # exact floats, through JSON and back
    assert gen.output_ids[-1] == tok.eos_token_id and gen.finish_reason == "stop"
    assert gen.backend == backend.name
    assert call.prompt_ids == prompt
    # The request asks for ids, not text, and never lets the server re-tokenize.
    sent = call.request
    assert sent["model"] == "policy"  # discovered from /v1/models
    assert sent["return_token_ids"] is True and sent["logprobs"] == 0
    assert sent["skip_special_tokens"] is False and sent["seed"] == 3
    assert "top_k" not in sent  # -1: disabled, left to the server's default


async def test_sampling_params_are_mapped(tok, chat_prompt):
    async with FakeVLLM(tok, replies="x") as server:
        backend = VLLMBackend(server.url, model="m")
        sampling = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, max_tokens=7, stop_token_ids=[5, 6])
        await backend.generate(chat_prompt(), sampling)
        await backend.close()
    sent = server.calls[0].request
    assert {k: sent[k] for k in ("model", "temperature", "top_p", "top_k", "max_tokens", "stop_token_ids")} == {
        "model": "m",
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "max_tokens": 7,
        "stop_token_ids": [5, 6],
    }
    assert "seed" not in sent


async def test_length_finish_has_no_eos(tok, chat_prompt):
    async with FakeVLLM(tok, replies="a long answer that goes on and on") as server:
        backend = VLLMBackend(server.url)
        gen = await backend.generate(chat_prompt(), SamplingParams(max_tokens=4))
        await backend.close()
    assert gen.finish_reason == "length" and len(gen.output_ids) == 4
    assert tok.eos_token_id not in gen.output_ids
    assert gen.output_ids == server.calls[0].output_ids


async def test_falls_back_to_token_id_strings(tok, chat_prompt):
    async with FakeVLLM(tok, replies="fallback works", return_token_ids_supported=False) as server:
        backend = VLLMBackend(server.url)
        gen = await backend.generate(chat_prompt(), SamplingParams())
        await backend.close()
    assert gen.output_ids == server.calls[0].output_ids
    assert gen.logprobs == server.calls[0].logprobs


async def test_server_error_is_llm_error_with_status_and_body(tok, chat_prompt):
    async with FakeVLLM(tok) as server:
        backend = VLLMBackend(server.url, model="m")
        server.fail_next(1, status=503)
        with pytest.raises(LLMError, match=r"HTTP 503.*scripted failure"):
            await backend.generate(chat_prompt(), SamplingParams())
        server.fail_next(1, mode="close")
        with pytest.raises(LLMError, match="ServerDisconnected"):
            await backend.generate(chat_prompt(), SamplingParams())
        assert (await backend.generate(chat_prompt(), SamplingParams())).output_ids
        assert backend.outstanding == 0
        await backend.close()


async def test_requests_fit_the_context_window_and_a_dead_server_fails(tok):
    async with FakeVLLM(tok, max_model_len=40, replies="x " * 50) as server:
        backend = VLLMBackend(server.url, model="m")
        gen = await backend.generate([1] * 30, SamplingParams(max_tokens=20))
        assert server.calls[-1].request["max_tokens"] == 10  # cut to the window (/v1/models)
        assert gen.finish_reason == "length" and len(gen.output_ids) == 10
        assert backend.context_window() == 40 and backend.describe()["max_model_len"] == 40
        with pytest.raises(ContextWindowError, match="not sent") as info:
            await backend.generate([1] * 40, SamplingParams(max_tokens=20))
        assert not info.value.retryable and len(server.calls) == 1
        await backend.close()
    # A server that does not report its window: its refusal is typed all the same.
    async with FakeVLLM(tok, max_model_len=40, report_max_model_len=False) as server:
        backend = VLLMBackend(server.url, model="m")
        for length, words in ((41, "maximum context length is 40"), (40, "at least 1, got 0")):
            with pytest.raises(ContextWindowError, match=words) as info:
                await backend.generate([1] * length, SamplingParams(max_tokens=5))
            assert info.value.status == 400 and not info.value.retryable
        assert backend.context_window() is None and [c.status for c in server.calls] == [400, 400]
        await backend.close()
    dead = VLLMBackend(server.url, model="m")  # the server is gone now
    with pytest.raises(LLMError, match="failed"):
        await dead.generate([1, 2], SamplingParams())
    assert await dead.health() is False
    await dead.close()


async def test_a_request_during_the_window_read_waits_for_it(tok):
    """Two requests at once on a fresh backend: the second must not go out unchecked
    while the first reads the window (it was sent, and the server refused it)."""
    async with FakeVLLM(tok, max_model_len=40, replies="x") as server:
        backend = VLLMBackend(server.url, model="m")
        reading, release = asyncio.Event(), asyncio.Event()
        request_json = backend.http.request_json

        async def slow_models(method, path, *args, **kw):
            if path == "/v1/models":
                reading.set()
                await asyncio.wait_for(release.wait(), 10)
            return await request_json(method, path, *args, **kw)

        backend.http.request_json = slow_models
        short = asyncio.create_task(backend.generate([1] * 5, SamplingParams(max_tokens=5)))
        await asyncio.wait_for(reading.wait(), 10)  # the short one reads the window
        long = asyncio.create_task(backend.generate([1] * 45, SamplingParams(max_tokens=5)))
        await asyncio.sleep(0)
        release.set()
        assert (await short).output_ids
        with pytest.raises(ContextWindowError, match="not sent"):
            await long
        assert [c.prompt_ids for c in server.calls] == [[1] * 5]
        await backend.close()
        # The same when a health check is the one reading it.
        backend = VLLMBackend(server.url, model="m")
        backend.http.request_json = slow_models
        reading.clear(), release.clear()
        health = asyncio.create_task(backend.health())
        await asyncio.wait_for(reading.wait(), 10)
        long = asyncio.create_task(backend.generate([1] * 45, SamplingParams(max_tokens=5)))
        await asyncio.sleep(0)
        release.set()
        assert await health is True
        with pytest.raises(ContextWindowError, match="not sent"):
            await long
        assert len(server.calls) == 1
        await backend.close()


def test_a_models_list_with_no_model_leaves_the_window_unknown():
    backend = VLLMBackend("http://127.0.0.1:9")
    assert backend.parse_window({"data": []}) is None
    assert backend.parse_window({"data": [{"id": "a", "max_model_len": 7}]}) == 7


async def test_own_timeout_is_llm_error_and_caller_deadline_cancels(tok, chat_prompt):
    async with FakeVLLM(tok) as server:
        backend = VLLMBackend(server.url, model="m", timeout=0.2)
        server.fail_next(1, mode="hang")
        with pytest.raises(LLMError, match="timed out"):
            await backend.generate(chat_prompt(), SamplingParams())
        patient = VLLMBackend(server.url, model="m")
        server.fail_next(1, mode="hang")
        with pytest.raises(TimeoutError):  # the caller's deadline stays a timeout
            async with asyncio.timeout(0.2):
                await patient.generate(chat_prompt(), SamplingParams())
        assert patient.outstanding == 0
        await backend.close()
        await patient.close()


async def test_health_describe_and_api_key(tok):
    async with FakeVLLM(tok, model="policy") as server:
        backend = VLLMBackend(server.url, name="gpu0", api_key="secret")
        assert await backend.health() is True
        await backend.generate([1, 2, 3], SamplingParams(max_tokens=2))
        assert backend.describe() == {
            "name": "gpu0",
            "kind": "vllm",
            "url": server.url,
            "model": "policy",
            "trainable": True,
            "outstanding": 0,
            "max_connections": 1024,
            "waiting_for_connection": 0,
            "max_model_len": 32768,
        }
        await backend.close()


async def test_many_concurrent_calls_share_one_session(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeVLLM(tok, replies="x", latency=0.05) as server:
        backend = VLLMBackend(server.url, model="m")
        gens = await asyncio.gather(*[backend.generate(prompt, SamplingParams()) for _ in range(300)])
        stats = server.stats()
        await backend.close()
    assert len(gens) == 300 and stats["max_in_flight"] > 150  # no client-side pool limit


def test_rejects_a_url_without_scheme():
    with pytest.raises(ValueError, match="url"):
        VLLMBackend("localhost:8000")


def test_a_backend_survives_its_event_loop(tok):
    server = FakeVLLM(tok, replies="again").start_in_thread()
    try:
        backend = VLLMBackend(server.url)
        for _ in range(2):  # two asyncio.run calls: two loops, one backend
            gen = asyncio.run(backend.generate([1, 2, 3], SamplingParams(max_tokens=4)))
            assert gen.output_ids == server.calls[-1].output_ids
        asyncio.run(backend.close())
    finally:
        server.stop()


async def test_malformed_or_inconsistent_replies_are_llm_errors():
    backend = VLLMBackend("http://127.0.0.1:9", model="m")
    replies = {
        "malformed completion reply": {"choices": []},
        "3 token ids but 2 logprobs": {
            "choices": [{"token_ids": [1, 2, 3], "logprobs": {"token_logprobs": [-1.0, -2.0]}}]
        },
        "differ from the prompt sent": {
            "choices": [
                {
                    "token_ids": [1],
                    "prompt_token_ids": [9, 9],
                    "logprobs": {"token_logprobs": [-1.0]},
                    "finish_reason": "stop",
                }
            ]
        },
        "not 'token_id:N'": {"choices": [{"logprobs": {"token_logprobs": [-1.0], "tokens": ["hello"]}}]},
    }
    for message, reply in replies.items():

        async def canned(path, body, reply=reply):
            return reply

        backend._post_json = canned
        with pytest.raises(LLMError, match=message):
            await backend.generate([1, 2], SamplingParams())


async def test_a_second_backend_on_the_server_adopts_the_adapter_without_loading_it(tok, chat_prompt, tmp_path):
    """A cluster node's replica has its own backend object on the same server: after the
    head's load it names the adapter (its server serves it), without a second load and
    without having read the base model's name; full weights name the base model again."""
    folder, checkpoint = tmp_path / "adapter", tmp_path / "step2"
    folder.mkdir()
    checkpoint.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    prompt = chat_prompt()
    sampling = SamplingParams(max_tokens=4)
    async with FakeVLLM(tok, replies="x", max_model_len=4096, runtime_lora=True, dev_mode=True) as server:
        head, replica = VLLMBackend(server.url), VLLMBackend(server.url)
        try:
            await head.load_lora("policy", str(folder))
            replica.adopt("policy")  # never used before: the base model's name unknown
            await replica.generate(prompt, sampling)
            assert server.calls[-1].request["model"] == "policy"
            assert server.weight_loads == [("lora:policy", str(folder))]
            assert replica.context_window() == 4096  # the base's, through the adapter's card
            await head.load_full(str(checkpoint))
            replica.adopt(None)
            await replica.generate(prompt, sampling)
            assert server.calls[-1].request["model"] == "fake-model"
            # an adopted backend that loads itself finds the base model's name on the server
            fresh = VLLMBackend(server.url)
            fresh.adopt("policy")
            await fresh.load_full(str(checkpoint))
            assert fresh.loaded_model() == "fake-model"
            await fresh.close()
        finally:
            await head.close()
            await replica.close()

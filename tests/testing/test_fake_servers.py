"""The SGLang and llama.cpp doubles (and FakeVLLM's extra routes) speak their server's
wire format, share one core (failures, capacity, pause) and record every call."""

import asyncio

import aiohttp
import pytest

from rollserve.testing.fake_llamacpp import FakeLlamaCpp
from rollserve.testing.fake_server import fake_logprob
from rollserve.testing.fake_sglang import FakeSGLang
from rollserve.testing.fake_vllm import FakeVLLM
from tests.waiting import eventually


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as client:
        async with client.post(url + path, json=body) as resp:
            return resp.status, await resp.json()


async def test_sglang_generate_shape(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeSGLang(tok, replies="The answer is 4.") as server:
        status, body = await post(
            server.url,
            "/generate",
            {
                "input_ids": prompt,
                "return_logprob": True,
                "logprob_start_len": -1,
                "sampling_params": {"max_new_tokens": 50, "temperature": 1.0, "sampling_seed": 9},
            },
        )
    assert status == 200 and set(body) == {"text", "output_ids", "meta_info"}
    ids = tok.encode("The answer is 4.") + [tok.eos_token_id]
    assert body["output_ids"] == ids and body["text"] == "The answer is 4."
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(ids)
    assert meta["output_token_logprobs"] == [[fake_logprob(prompt, i, seed=9), t, None] for i, t in enumerate(ids)]
    assert server.calls[0].output_ids == ids and server.calls[0].route == "/generate"


async def test_sglang_rejects_openai_field_names_and_reports_length(tok, chat_prompt):
    async with FakeSGLang(tok, replies="a b c d e f") as server:
        status, body = await post(
            server.url, "/generate", {"input_ids": chat_prompt(), "sampling_params": {"max_tokens": 3}}
        )
        assert status == 400 and "max_tokens" in body["error"]["message"]
        _, body = await post(
            server.url, "/generate", {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 3}}
        )
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert "output_token_logprobs" not in body["meta_info"]  # not asked for


async def test_llamacpp_completion_shape(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeLlamaCpp(tok, replies="Four.", model="smol.gguf") as server:
        status, body = await post(
            server.url,
            "/completion",
            {"prompt": prompt, "n_predict": 20, "n_probs": 1, "return_tokens": True, "seed": 4},
        )
        _, plain = await post(server.url, "/completion", {"prompt": prompt, "n_predict": 20})
        _, post_sampling = await post(
            server.url, "/completion", {"prompt": prompt, "n_probs": 1, "post_sampling_probs": True}
        )
        async with aiohttp.ClientSession() as client:
            async with client.get(server.url + "/health") as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok"}
    ids = tok.encode("Four.") + [tok.eos_token_id]
    assert status == 200 and body["tokens"] == ids and body["content"] == "Four."
    assert body["stop_type"] == "eos" and body["tokens_evaluated"] == len(prompt)
    assert {
        "index",
        "content",
        "tokens",
        "id_slot",
        "stop",
        "model",
        "tokens_predicted",
        "tokens_evaluated",
        "generation_settings",
        "prompt",
        "has_new_line",
        "truncated",
        "stop_type",
        "stopping_word",
        "tokens_cached",
        "timings",
        "completion_probabilities",
    } == set(body)
    entry = body["completion_probabilities"][0]
    assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"}
    assert [p["id"] for p in body["completion_probabilities"]] == ids
    assert [p["logprob"] for p in body["completion_probabilities"]] == [
        fake_logprob(prompt, i, seed=4) for i in range(len(ids))
    ]
    assert plain["tokens"] == [] and "completion_probabilities" not in plain
    assert set(post_sampling["completion_probabilities"][0]) == {"id", "token", "bytes", "prob", "top_probs"}


async def test_llamacpp_skips_tokens_inside_a_utf8_character(tok, chat_prompt):
    async with FakeLlamaCpp(tok, replies="a 🦜") as server:
        _, body = await post(server.url, "/completion", {"prompt": chat_prompt(), "n_probs": 1, "return_tokens": True})
    ids = body["tokens"]
    listed = [p["id"] for p in body["completion_probabilities"]]
    assert len(listed) == len(ids) - 2  # the parrot's first two byte tokens have no entry
    assert listed == [t for i, t in enumerate(ids) if not tok.decode(ids[: i + 1]).endswith("\ufffd")]


async def test_llamacpp_context_errors(tok):
    async with FakeLlamaCpp(tok, max_model_len=32, replies="x " * 40) as server:
        status, body = await post(server.url, "/completion", {"prompt": [1] * 40})
        assert status == 400 and body["error"]["type"] == "exceed_context_size_error"
        _, body = await post(server.url, "/completion", {"prompt": [1] * 20, "return_tokens": True})
    assert body["stop_type"] == "limit" and len(body["tokens"]) == 12 and body["truncated"]


async def test_vllm_generate_and_chat_routes(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeVLLM(tok, replies="Hi!", generate_endpoint=True) as server:
        status, body = await post(
            server.url,
            "/inference/v1/generate",
            {"token_ids": prompt, "sampling_params": {"max_tokens": 10, "logprobs": 0}, "return_token_ids": True},
        )
        assert status == 200 and body["prompt_token_ids"] == prompt
        choice = body["choices"][0]
        assert choice["token_ids"] == tok.encode("Hi!") + [tok.eos_token_id]
        assert [c["token_id"] for c in choice["logprobs"]["content"]] == choice["token_ids"]
        status, chat = await post(
            server.url,
            "/v1/chat/completions",
            {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]},
        )
    assert status == 200 and chat["choices"][0]["message"]["content"] == "Hi!"
    assert chat["usage"]["prompt_tokens"] == len(server.calls[1].prompt_ids)
    async with FakeVLLM(tok) as server:  # without --enable-scale-out there is no such route
        async with aiohttp.ClientSession() as client:
            async with client.post(server.url + "/inference/v1/generate", json={}) as resp:
                assert resp.status == 404


@pytest.mark.parametrize("mode", ["abort", "in_place"])
async def test_a_paused_server_holds_new_calls_and_aborts_running_ones(tok, chat_prompt, mode):
    async with FakeSGLang(tok, replies="slow", latency=5.0) as server:
        body = {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 5}, "return_logprob": True}
        running = asyncio.create_task(post(server.url, "/generate", body))
        await eventually(lambda: server.calls and server.calls[0].started_at is not None, what="the first call running")
        await post(server.url, "/pause_generation", {"mode": mode})
        held = asyncio.create_task(post(server.url, "/generate", body))
        await eventually(lambda: len(server.calls) == 2, what="the second call at the server")
        assert not held.done()  # held: it ends only after /continue_generation, below
        if mode == "abort":
            _, first = await asyncio.wait_for(running, 2)
            assert first["meta_info"]["finish_reason"]["type"] == "abort"
            assert first["output_ids"] == []
        server.latency = 0.0
        await post(server.url, "/continue_generation", {})
        _, second = await asyncio.wait_for(held, 2)
        assert second["meta_info"]["finish_reason"]["type"] == "stop"
        running.cancel()

"""FakeVLLM speaks vLLM 0.32's wire format, records every call, and fails on demand."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest

from rollserve.testing import FakeVLLM, fake_logprob

EARLY = 1e-3  # slack for a lower bound on measured time (see the capacity test)


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as client:
        async with client.post(url + path, json=body) as resp:
            return resp.status, await resp.json()


async def test_completion_has_vllm_shape_and_is_recorded(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeVLLM(tok, replies=["The answer is 4."]) as server:
        status, body = await post(
            server.url,
            "/v1/completions",
            {
                "model": "fake-model",
                "prompt": prompt,
                "max_tokens": 50,
                "temperature": 1.0,
                "seed": 7,
                "logprobs": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
            },
        )
    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    expected_ids = tok.encode("The answer is 4.") + [tok.eos_token_id]
    assert choice["token_ids"] == expected_ids  # the final eos included, as vLLM does
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == "The answer is 4."  # the stop token is not in the text
    assert choice["prompt_token_ids"] == prompt
    lps = choice["logprobs"]["token_logprobs"]
    assert lps == [fake_logprob(prompt, i, seed=7) for i in range(len(expected_ids))]
    assert all(lp < 0 for lp in lps)
    assert len(choice["logprobs"]["tokens"]) == len(expected_ids)
    assert choice["logprobs"]["top_logprobs"] == [{token: lp} for token, lp in zip(choice["logprobs"]["tokens"], lps)]
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(expected_ids),
        "total_tokens": len(prompt) + len(expected_ids),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    # The keys a real vLLM 0.32 server returns (recorded from one).
    assert set(choice) == {
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    }
    assert set(body) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    }
    [call] = server.calls
    assert call.prompt_ids == prompt and call.output_ids == expected_ids
    assert call.logprobs == lps and call.finish_reason == "stop" and call.status == 200


async def test_max_tokens_cuts_with_length(tok, chat_prompt):
    async with FakeVLLM(tok, replies=["one two three four five six"]) as server:
        _, body = await post(
            server.url,
            "/v1/completions",
            {"prompt": [chat_prompt()], "max_tokens": 3, "logprobs": 0, "return_token_ids": True},
        )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["token_ids"] == tok.encode("one two three four five six")[:3]
    assert tok.eos_token_id not in choice["token_ids"]


async def test_stop_token_ids_end_the_reply(tok, chat_prompt):
    reply_ids = tok.encode("alpha beta gamma")
    async with FakeVLLM(tok, replies="alpha beta gamma") as server:
        _, body = await post(
            server.url,
            "/v1/completions",
            {
                "prompt": chat_prompt(),
                "max_tokens": 20,
                "return_token_ids": True,
                "stop_token_ids": [reply_ids[1]],
            },
        )
    choice = body["choices"][0]
    assert choice["token_ids"] == reply_ids[:2]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == reply_ids[1]


async def test_replies_cycle_and_callables_see_the_prompt(tok, chat_prompt):
    async with FakeVLLM(tok, replies=["a", "b"]) as server:
        texts = [
            (await post(server.url, "/v1/completions", {"prompt": chat_prompt()}))[1]["choices"][0]["text"]
            for _ in range(3)
        ]
    assert texts == ["a", "b", "a"]

    seen = []

    async def echo(prompt_ids, prompt_text):  # async callables work too
        seen.append(prompt_ids)
        return "you said " + prompt_text.split("user\n")[-1].split("<|im_end|>")[0]

    async with FakeVLLM(tok, replies=echo) as server:
        _, body = await post(server.url, "/v1/completions", {"prompt": chat_prompt("ping")})
    assert body["choices"][0]["text"] == "you said ping"
    assert seen == [chat_prompt("ping")]


async def test_tokens_as_token_ids_and_servers_without_return_token_ids(tok, chat_prompt):
    async with FakeVLLM(tok, replies="hi", return_token_ids_supported=False) as server:
        _, body = await post(
            server.url,
            "/v1/completions",
            {
                "prompt": chat_prompt(),
                "logprobs": 0,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            },
        )
    choice = body["choices"][0]
    assert choice["token_ids"] is None
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in server.calls[0].output_ids]


async def test_bad_requests_get_400(tok):
    async with FakeVLLM(tok, max_model_len=64) as server:
        status, body = await post(server.url, "/v1/completions", {"prompt": [[1, 2], [3]]})
        assert status == 400 and "prompt" in body["error"]["message"]
        # vLLM 0.32's words, as a real server answered them (N + 1 tokens: "at least").
        status, body = await post(server.url, "/v1/completions", {"prompt": [1] * 65, "max_tokens": 10})
        assert status == 400 and body["error"]["param"] == "input_tokens"
        assert body["error"]["message"] == (
            "This model's maximum context length is 64 tokens. However, your prompt contains at "
            "least 65 input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt. (parameter=input_tokens, value=65)"
        )
        status, body = await post(server.url, "/v1/completions", {"prompt": [1] * 69})
        assert "your prompt contains 69 input tokens" in body["error"]["message"]
        status, body = await post(server.url, "/v1/completions", {"prompt": [1] * 64})
        assert status == 400 and "max_tokens must be at least 1, got 0" in body["error"]["message"]
        # vLLM 0.32 cuts max_tokens to what the context leaves, and samples.
        status, body = await post(
            server.url, "/v1/completions", {"prompt": [1] * 60, "max_tokens": 10, "return_token_ids": True}
        )
        assert status == 200 and len(body["choices"][0]["token_ids"]) <= 4
    assert [c.status for c in server.calls] == [400, 400, 400, 400, 200]


async def test_health_models_tokenize(tok):
    async with FakeVLLM(tok, model="policy") as server:
        async with aiohttp.ClientSession() as client:
            async with client.get(server.url + "/health") as resp:
                assert resp.status == 200
            async with client.get(server.url + "/v1/models") as resp:
                assert (await resp.json())["data"][0]["id"] == "policy"
        messages = [{"role": "user", "content": "hi"}]
        _, body = await post(server.url, "/tokenize", {"messages": messages})
        expected = tok.encode(tok.render(messages, add_generation_prompt=True))
        assert body == {"count": len(expected), "max_model_len": 32768, "tokens": expected, "token_strs": None}
        _, body = await post(server.url, "/tokenize", {"prompt": "hello world"})
        assert body["tokens"] == tok.encode("hello world")


@pytest.mark.parametrize("mode", ["error", "close", "hang"])
async def test_scripted_failures_then_recovery(tok, chat_prompt, mode):
    async with FakeVLLM(tok, replies="ok") as server:
        server.fail_next(2, mode=mode)
        for _ in range(2):
            if mode == "error":
                status, _ = await post(server.url, "/v1/completions", {"prompt": chat_prompt()})
                assert status == 500
            elif mode == "close":
                with pytest.raises(aiohttp.ServerDisconnectedError):
                    await post(server.url, "/v1/completions", {"prompt": chat_prompt()})
            else:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await post(server.url, "/v1/completions", {"prompt": chat_prompt()})
        status, body = await post(server.url, "/v1/completions", {"prompt": chat_prompt()})
        assert status == 200 and body["choices"][0]["text"] == "ok"
    assert [c.failure for c in server.calls] == [mode, mode, None]


async def test_capacity_queues_and_stats_report_busy_time(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeVLLM(tok, replies="x", latency=0.1, capacity=2) as server:
        idle_from = time.perf_counter()
        await asyncio.sleep(0.1)  # sleep-ok: the idle time under test (wall time, not busy time)
        started = time.perf_counter()
        idle = started - idle_from
        await asyncio.gather(*[post(server.url, "/v1/completions", {"prompt": prompt}) for _ in range(6)])
        elapsed = time.perf_counter() - started
        stats = server.stats()
    # What the meter guarantees however loaded the machine (bounds, not a timed window):
    # 6 calls, 2 slots, 0.1 s each: three waves, each call holding a slot 0.1 s at least.
    # (EARLY: asyncio may fire a timer up to its clock's resolution early; float sums.)
    assert elapsed >= 0.3 - EARLY
    assert stats["max_in_flight"] == 2 and stats["requests"] == 6 and stats["in_flight"] == 0
    assert stats["slot_seconds"] >= 0.6 - EARLY
    assert stats["busy_seconds"] >= 0.3 - EARLY
    assert stats["slot_seconds"] <= 2 * stats["busy_seconds"] + EARLY  # never over capacity
    # the idle time counts in wall time, not in busy time
    assert stats["busy_seconds"] <= stats["wall_seconds"] - idle + EARLY
    assert stats["busy_fraction"] == pytest.approx(stats["busy_seconds"] / stats["wall_seconds"])
    assert stats["utilization"] == pytest.approx(stats["slot_seconds"] / (stats["wall_seconds"] * 2))


async def test_latency_callable_gets_prompt_and_output(tok, chat_prompt):
    seen = []

    def latency(prompt_ids, output_ids):
        seen.append((len(prompt_ids), len(output_ids)))
        return 0.0

    async with FakeVLLM(tok, replies="two words", latency=latency) as server:
        await post(server.url, "/v1/completions", {"prompt": chat_prompt()})
    assert seen == [(len(chat_prompt()), len(tok.encode("two words")) + 1)]


def test_runs_in_a_thread_for_sync_code(tok, chat_prompt):
    with FakeVLLM(tok, replies="sync") as server:
        request = urllib.request.Request(
            server.url + "/v1/completions",
            data=json.dumps({"prompt": chat_prompt(), "return_token_ids": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        body = json.load(urllib.request.urlopen(request, timeout=10))
        assert body["choices"][0]["text"] == "sync"
    assert server.calls[0].output_ids == body["choices"][0]["token_ids"]
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + "/health", timeout=2)


def test_command_line_entry_serves():
    """Run as ``python -m``, with runpy's double-import warning an error: the package
    ``rollserve.testing`` must not import the module it runs (its face is lazy)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-W",
            "error:'rollserve.testing.fake_vllm' found in sys.modules:RuntimeWarning",
            "-m",
            "rollserve.testing.fake_vllm",
            "--port",
            str(port),
            "--reply",
            "hello",
            "--latency",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    try:
        assert b"serving" in proc.stdout.readline()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"prompt": [1, 2, 3]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        body = json.load(urllib.request.urlopen(request, timeout=10))
        assert body["choices"][0]["text"] == "hello"
    finally:
        proc.terminate()
        proc.wait(10)


def test_command_line_paused_holds_every_call_until_resume():
    """``--paused`` (a benchmark's gate): calls wait, unanswered, until POST /resume."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "rollserve.testing.fake_vllm", "--port", str(port), "--reply", "hi", "--paused"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    async def check() -> None:
        async with aiohttp.ClientSession() as client:
            async with client.get(url + "/is_paused") as resp:
                assert (await resp.json()) == {"is_paused": True}
            call = asyncio.create_task(post(url, "/v1/completions", {"prompt": [1, 2, 3]}))
            async with client.get(url + "/health") as resp:  # answered while the call waits
                assert resp.status == 200
            done, _ = await asyncio.wait([call], timeout=1.0)  # unpaused, it answers in ms
            assert not done
            async with client.post(url + "/resume") as resp:
                assert resp.status == 200
            status, body = await asyncio.wait_for(call, 30)
            assert status == 200 and body["choices"][0]["text"] == "hi"

    try:
        assert b"serving" in proc.stdout.readline()
        asyncio.run(check())
    finally:
        proc.terminate()
        proc.wait(10)

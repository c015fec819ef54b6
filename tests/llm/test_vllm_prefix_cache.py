"""VLLMBackend resets the server's prefix cache after a weight load: vLLM refuses a
reset (``{"success": false}``) while running requests hold KV blocks, so it is tried
again, a bounded number of times, then the load fails, typed. (The API-level tests are
tests/api/test_prefix_cache_api.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rollserve.errors import LLMError
from rollserve.llm.backends import vllm
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.testing import FakeVLLM
from tests.waiting import eventually


def adapter(tmp_path: Path) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    return str(folder)


async def running(server: FakeVLLM, tok_ids: list[int]) -> asyncio.Task[httpx.Response]:
    """A request from another client, running on ``server`` (it holds KV blocks)."""

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            return await client.post(
                f"{server.url}/v1/completions", json={"model": server.model, "prompt": tok_ids, "max_tokens": 2}
            )

    task = asyncio.create_task(post())
    await eventually(
        lambda: any(c.started_at is not None and c.status is None for c in server.calls),
        timeout=30,
        what="the request to run",
    )
    return task


async def test_a_refused_reset_is_tried_again_until_the_running_request_ends(tok, chat_prompt, tmp_path):
    async with FakeVLLM(tok, replies="x", runtime_lora=True, dev_mode=True, latency=1.0) as server:
        backend = VLLMBackend(server.url)
        try:
            other = await running(server, chat_prompt())
            await backend.load_lora("policy", adapter(tmp_path))
            assert (await other).status_code == 200
        finally:
            await backend.close()
    assert server.prefix_cache_refusals >= 1 and server.prefix_cache_resets == 1


async def test_a_reset_refused_every_time_fails_the_load_typed(tok, chat_prompt, tmp_path):
    async with FakeVLLM(tok, replies="x", runtime_lora=True, dev_mode=True, latency=60.0) as server:
        backend = VLLMBackend(server.url)
        other = await running(server, chat_prompt())
        try:
            with pytest.raises(LLMError, match="refused to reset its prefix cache") as failed:
                await backend.load_lora("policy", adapter(tmp_path))
        finally:
            other.cancel()
            await backend.close()
    assert failed.value.backend == backend.name
    assert server.prefix_cache_refusals == vllm.RESET_TRIES and server.prefix_cache_resets == 0
    assert backend.loaded_model() == "policy"  # the server serves it: only the reset failed


def test_an_empty_200_from_an_older_server_is_a_reset():
    """Older vLLM servers answered ``/reset_prefix_cache`` with an empty 200."""
    assert vllm.reset_succeeded(None)
    assert vllm.reset_succeeded({"success": True})
    assert not vllm.reset_succeeded({"success": False})
    assert not vllm.reset_succeeded({"detail": "odd"})


def test_prefix_cache_setting_is_checked():
    with pytest.raises(ValueError, match="prefix_cache"):
        VLLMBackend("http://127.0.0.1:1", prefix_cache="sometimes")  # type: ignore[arg-type]

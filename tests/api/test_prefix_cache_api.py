"""A weight load into vLLM resets its prefix cache, through the HTTP API as a trainer
syncs weights. vLLM keys a LoRA's cached KV blocks by the adapter's name (0.32: and
path), not its weights: after an in-place reload from the same folder, a request whose
prompt starts as an earlier one did reuses blocks computed with the previous adapter,
and its tokens, sampled partly by the old policy, would be stamped with the new version
(vLLM issue #42125). The double caches prefixes the same way (``prefix_caching``, on by
default as on vLLM), so a turn sampled through a stale block has the old weights'
logprobs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollserve.client.weights import AsyncWeightSync, LoRA, WeightLoadFailed
from rollserve.testing import FakeVLLM
from rollserve.testing.fake_server import fake_logprobs
from tests.api.test_weight_sync_api import (
    SETTINGS,
    TASK,
    adapter,
    rollouts,
    rollserve_client,
    sampled_by,
)


def retrain(folder: str, step: int) -> None:
    """The trainer writes the next adapter version over the same folder."""
    (Path(folder) / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "step": step}))


def assert_sampled_by(fake: FakeVLLM, results: list[dict], version: int, weights: str) -> None:
    """Every turn of ``results`` is stamped ``version`` and has the logprobs of ``weights``."""
    turns = [t for r in results for t in r["trajectory"]["turns"]]
    assert turns
    for turn in turns:
        call = sampled_by(fake, turn)
        assert turn["policy_version"] == version
        assert turn["logprobs"] == fake_logprobs(call.prompt_ids, len(turn["logprobs"]), None, weights)


async def test_an_in_place_reload_from_the_same_folder_samples_only_the_new_adapter(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake:
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        path = adapter(tmp_path)
        await sync.update(LoRA("policy", path), policy_version=2)
        first = await rollouts(client, 2)  # these prompts' first blocks are cached now
        retrain(path, 3)
        report = await sync.update(LoRA("policy", path), policy_version=3)
        second = await rollouts(client, 2)  # the same prompts again
        await client.aclose()
    assert report.loaded.ok and report.resumed.policy_version == 3
    assert fake.weight_loads == [("lora:policy", path)] * 2
    assert_sampled_by(fake, first, 2, f"lora:policy:{path}#1")
    # not one turn stamped 3 reused a block of version 2
    assert_sampled_by(fake, second, 3, f"lora:policy:{path}#2")
    assert fake.prefix_cache_resets == 2  # once after each load


async def test_a_server_that_cannot_reset_its_prefix_cache_fails_the_load_and_stays_paused(make_api, tok, tmp_path):
    """Not in dev mode, vLLM has no /reset_prefix_cache (a 404): the adapter is loaded
    but the load is not clean, so the trainer is told how to fix it and nothing samples."""
    async with FakeVLLM(tok, runtime_lora=True) as fake:
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        with pytest.raises(WeightLoadFailed) as failed:
            await sync.update(LoRA("policy", adapter(tmp_path)), policy_version=2)
        error = failed.value
        status = await client.list_backends()
        accepted = await client.submit([{**TASK, "n": 1}], **SETTINGS)
        await asyncio.sleep(0.3)  # sleep-ok: observation window for calls sent while paused
        calls = list(fake.calls)
        group = await client.group(accepted.groups[0].group_id)
        await client.aclose()
    assert error.paused and error.policy_version == 1
    outcome = error.outcomes[next(iter(error.outcomes))]
    assert "cannot reset its prefix cache" in outcome
    assert "VLLM_SERVER_DEV_MODE=1" in outcome and "--no-enable-prefix-caching" in outcome
    assert '"prefix_cache": "off"' in outcome
    assert status.router.paused and status.router.policy_version == 1
    assert not calls and not group.done  # nothing sampled while the weights are unsure


async def test_prefix_cache_off_loads_without_a_reset(make_api, tok, tmp_path):
    """A server started with --no-enable-prefix-caching (not in dev mode), registered
    with ``"prefix_cache": "off"``: loads pass without a reset, and nothing is stale."""
    async with FakeVLLM(tok, runtime_lora=True, prefix_caching=False) as fake:
        spec = json.dumps({"url": fake.url, "prefix_cache": "off"})
        service, http = await make_api([spec])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        path = adapter(tmp_path)
        await sync.update(LoRA("policy", path), policy_version=2)
        await rollouts(client, 1)
        retrain(path, 3)
        report = await sync.update(LoRA("policy", path), policy_version=3)
        after = await rollouts(client, 2)
        listing = (await http.get("/v1/llm/backends")).json()
        bad = await http.post("/v1/llm/backends", json={"url": fake.url, "name": "other", "prefix_cache": "sometimes"})
        await client.aclose()
    assert report.loaded.ok and fake.prefix_cache_resets == 0
    assert_sampled_by(fake, after, 3, f"lora:policy:{path}#2")
    assert listing["backends"][0]["prefix_cache"] == "off"
    assert bad.status_code == 422 and "prefix_cache" in bad.text

"""Weight sync into a real vLLM server: a LoRA adapter loaded at run time through
rollserve's API, and every later turn sampled from, and stamped with, the new policy.

Skipped unless ROLLSERVE_VLLM_LORA_URL points at a vLLM serving SmolLM2 with runtime
LoRA loading (``--enable-lora --max-lora-rank 8`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; ``scripts/vllm_cpu/start.sh`` with
``ROLLSERVE_VLLM_LORA=1`` starts one). The adapter is made here (random rank-8 q/v
projections, PEFT's file layout), so no download is needed. Note: the tests leave the
adapter loaded on that server, and reload its weights from its own model folder
(``$ROLLSERVE_VLLM_HOME/smollm2``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from rollserve.api.app import create_app
from rollserve.client import AsyncClient
from rollserve.client.weights import AsyncWeightSync, FullWeights, LoRA, WeightLoadFailed
from rollserve.server import ServerConfig, Service
from tests.e2e.test_real_vllm import LOGPROB_TOLERANCE, _vllm_prompt_logprobs

# Each test takes `vllm_lora_url` (tests/real_vllm.py): skips without one.
pytestmark = pytest.mark.vllm
TASK = {"data_source": "math", "n": 2, "instance": {"question": "What is 7 * 6?", "answer": "42"}}
SETTINGS = {"sampling": {"temperature": 1.0, "max_tokens": 24}, "agent": {"max_turns": 1}}
# SmolLM2-135M: 30 layers, hidden 576, 3 KV heads of 64.
LAYERS, HIDDEN, KV, RANK = 30, 576, 192, 8


def make_adapter(folder: Path, seed: int, scale: float = 0.05) -> str:
    """A PEFT LoRA adapter for SmolLM2's q_proj and v_proj, random and large enough to
    move logprobs clearly."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for module, out in (("q_proj", HIDDEN), ("v_proj", KV)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((RANK, HIDDEN)) * scale).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out, RANK)) * scale).astype(np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": RANK,
                "lora_alpha": 16,
                "lora_dropout": 0.0,
                "target_modules": ["q_proj", "v_proj"],
                "bias": "none",
                "fan_in_fan_out": False,
                "modules_to_save": None,
                "use_rslora": False,
                "use_dora": False,
            }
        )
    )
    return str(folder)


async def sampled(client: AsyncClient) -> list[dict]:
    accepted = await client.submit([TASK], **SETTINGS)
    view = await client.wait_group(accepted.groups[0].group_id, timeout=300)
    assert view.done
    results = [m.result.model_dump(mode="json") for m in view.rollouts if m.result is not None]
    assert len(results) == 2 and all(r["status"] == "completed" for r in results), results
    return results


async def gap(vllm: httpx.AsyncClient, result: dict, model: str) -> list[float]:
    """|rollserve's logprob - vLLM's recomputation under ``model``| per sampled token."""
    tokens = result["trajectory"]["tokens"]
    expected = await _vllm_prompt_logprobs(vllm, model, tokens["input_ids"])
    return [
        abs(lp - expected[i])
        for i, (lp, m) in enumerate(zip(tokens["logprobs"], tokens["loss_mask"], strict=True))
        if m
    ]


@contextlib.asynccontextmanager
async def rollserve_on_vllm(tmp_path: Path, url: str) -> AsyncIterator[tuple[AsyncClient, httpx.AsyncClient]]:
    """A rollserve service on the LoRA-enabled vLLM at ``url``, its client, and a client
    of that vLLM; all closed at the end."""
    service = Service(ServerConfig(state_dir=tmp_path / "state", backends=[url]))
    await service.start()
    client = AsyncClient(
        "http://rollserve", timeout=300, transport=httpx.ASGITransport(app=create_app(service, manage_lifecycle=False))
    )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=300) as vllm:
            yield client, vllm
    finally:
        await client.aclose()
        await service.stop()


async def test_a_lora_sync_reaches_real_vllm_and_later_turns_sample_from_it(tmp_path, vllm_lora_url):
    async with rollserve_on_vllm(tmp_path, vllm_lora_url) as (client, vllm):
        base = (await vllm.get("/v1/models")).json()["data"][0]["id"]
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        with pytest.raises(WeightLoadFailed, match="No adapter found"):
            await sync.update(LoRA("policy", str(tmp_path / "missing")), 2)
        await client.resume()  # nothing was loaded: back to the old version
        before = await sampled(client)
        report = await sync.update(LoRA("policy", make_adapter(tmp_path / "a", 1)), 2)
        after = await sampled(client)
        new_gaps = [g for r in after for g in await gap(vllm, r, "policy")]
        old_gaps = [g for r in after for g in await gap(vllm, r, base)]
        before_gaps = [g for r in before for g in await gap(vllm, r, base)]
    assert report.loaded.ok and list(report.loaded.models.values()) == ["policy"]
    assert {t["policy_version"] for r in before for t in r["trajectory"]["turns"]} == {1}
    assert {t["policy_version"] for r in after for t in r["trajectory"]["turns"]} == {2}
    assert max(before_gaps) <= LOGPROB_TOLERANCE  # version 1: the base weights sampled
    assert max(new_gaps) <= LOGPROB_TOLERANCE  # version 2: the adapter sampled...
    assert sum(old_gaps) / len(old_gaps) > 10 * LOGPROB_TOLERANCE  # ...not the base weights
    print(
        f"\nbefore: max |d| {max(before_gaps):.2e} vs base; after: max |d| "
        f"{max(new_gaps):.2e} vs the adapter, mean {sum(old_gaps) / len(old_gaps):.3f} vs base"
    )


async def test_full_weights_reload_on_real_vllm_dev_mode(tmp_path, vllm_lora_url):
    """Full weights from disk (dev mode's ``reload_weights``): the server's own model
    folder again, so what it samples afterwards still matches the base weights."""
    home = Path(os.environ.get("ROLLSERVE_VLLM_HOME", Path.home() / ".cache/rollserve/vllm-cpu"))
    if not (home / "smollm2" / "config.json").is_file():
        pytest.skip(f"no model folder at {home / 'smollm2'} (set ROLLSERVE_VLLM_HOME)")
    async with rollserve_on_vllm(tmp_path, vllm_lora_url) as (client, vllm):
        base = (await vllm.get("/v1/models")).json()["data"][0]["id"]
        await client.resume(policy_version=4)
        # (No failing reload here: on vLLM 0.32 CPU a reload_weights that fails
        # leaves the model's weights unusable, and the next request kills the engine.)
        report = await AsyncWeightSync(client).update(FullWeights(str(home / "smollm2")), 5)
        after = await sampled(client)
        gaps = [g for r in after for g in await gap(vllm, r, base)]
        assert (await vllm.get("/is_paused")).json() == {"is_paused": False}
    assert report.loaded.ok and list(report.loaded.models.values()) == [base]
    assert {t["policy_version"] for r in after for t in r["trajectory"]["turns"]} == {5}
    assert max(gaps) <= LOGPROB_TOLERANCE

"""A LoRA load through rollserve resets a real vLLM server's prefix cache.

vLLM 0.32 keys a LoRA's cached KV blocks by the adapter's name and path, not its
weights: after an in-place reload from the same folder, a prompt seen before reuses
blocks computed with the previous adapter (vLLM issue #42125). rollserve resets the
cache after each load; this test reads vLLM's own counters (``/metrics``:
``vllm:prefix_cache_hits_total``) to see that a prompt cached before the reload is
computed afresh after it.

Needs a vLLM serving SmolLM2 with runtime LoRA loading and dev mode (the
``vllm_lora_url`` fixture, tests/real_vllm.py: ``ROLLSERVE_VLLM_LORA_URL``;
``scripts/vllm_cpu/start.sh`` with ``ROLLSERVE_VLLM_LORA=1`` serves one); skips without
one. It reads server-wide counters, so nothing else should use that server meanwhile.
"""

from __future__ import annotations

import re

import httpx
import pytest

from rollserve.client.weights import AsyncWeightSync, LoRA
from tests.e2e.test_real_vllm_weights import make_adapter, rollserve_on_vllm
from tests.waiting import eventually

pytestmark = pytest.mark.vllm
NAME = "prefix-probe"  # an adapter name of this test's own
# 3 of vLLM CPU's 128-token blocks and a bit: only full blocks are cached
PROMPT = [(i * 37) % 4000 + 100 for i in range(400)]


async def counters(vllm: httpx.AsyncClient) -> tuple[float, float]:
    """vLLM's prefix-cache (queries, hits) so far, in tokens."""
    text = (await vllm.get("/metrics")).text

    def total(metric: str) -> float:
        found = re.findall(rf"^vllm:{metric}_total(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        assert found, f"no vllm:{metric}_total in /metrics"
        return sum(float(v) for v in found)

    return total("prefix_cache_queries"), total("prefix_cache_hits")


async def cached_tokens(vllm: httpx.AsyncClient) -> float:
    """Send PROMPT to the adapter: how many of its tokens came from the prefix cache
    (the counters are updated as the engine reports; waited for, bounded)."""
    queries, hits = await counters(vllm)
    reply = await vllm.post(
        "/v1/completions", json={"model": NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0}
    )
    assert reply.status_code == 200, reply.text

    async def counted() -> tuple[float] | None:
        now_queries, now_hits = await counters(vllm)
        return (now_hits - hits,) if now_queries - queries >= len(PROMPT) else None

    (cached,) = await eventually(counted, timeout=60, what="the engine to count the prompt", interval=0.2)
    return cached


async def test_a_lora_reload_through_rollserve_resets_the_real_prefix_cache(tmp_path, vllm_lora_url):
    folder = tmp_path / "adapter"
    async with rollserve_on_vllm(tmp_path, vllm_lora_url) as (client, vllm):
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        await sync.update(LoRA(NAME, make_adapter(folder, seed=1)), policy_version=2)
        await cached_tokens(vllm)  # computed under version 2, and cached
        warm = await cached_tokens(vllm)
        # the trainer writes version 3 over the same folder; rollserve reloads it in place
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
        make_adapter(folder, seed=2)
        report = await sync.update(LoRA(NAME, str(folder)), policy_version=3)
        after = await cached_tokens(vllm)
    assert report.loaded.ok
    assert warm >= 128  # the cache works: the same prompt reused its blocks...
    assert after == 0  # ...until the reload: nothing computed under version 2 was reused
    print(f"\n{warm:.0f} of {len(PROMPT)} prompt tokens from the cache before the reload, {after:.0f} after")

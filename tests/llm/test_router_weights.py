"""The router's weight load: only while paused, never two at once, no resume during
one, each load bounded (a server that never answers is reported, not waited on)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from rollserve.llm.base import Generation, LLMBackend, LoadsWeights, SamplingParams, WeightsKind
from rollserve.llm.routing.router import Router
from rollserve.llm.routing.weights import WeightsRefused, WeightUpdate

LORA = WeightUpdate(kind="lora", name="policy", path="/ckpt")


class HeldLoader(LLMBackend, LoadsWeights):
    """A backend whose loads end when the test says so."""

    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"lora"})

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = asyncio.Event()
        self.model: str | None = "base"

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return Generation([1], [-0.5], "stop")

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "held", "trainable": True}

    async def load_lora(self, name: str, path: str) -> None:
        await self.release.wait()
        self.model = name

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        raise NotImplementedError

    def loaded_model(self) -> str | None:
        return self.model


async def test_a_load_runs_only_while_paused_and_alone_and_holds_off_a_resume():
    router = Router(policy_version=1)
    backend = HeldLoader("a")
    router.add(backend)
    with pytest.raises(WeightsRefused, match="not paused"):
        await router.load_weights(LORA, timeout=5)
    await router.pause("finish")
    loading = asyncio.create_task(router.load_weights(LORA, timeout=5))
    await asyncio.sleep(0.05)
    with pytest.raises(WeightsRefused, match="under way"):
        await router.load_weights(LORA, timeout=5)
    with pytest.raises(WeightsRefused, match="under way"):
        await router.resume(policy_version=2)
    assert router.paused and router.policy_version == 1
    backend.release.set()
    assert await asyncio.wait_for(loading, 5) == {"a": "ok"}
    assert backend.model == "policy"
    assert (await router.resume(policy_version=2))["policy_version"] == 2


async def test_a_load_that_never_answers_is_reported_within_its_timeout():
    router = Router(policy_version=1)
    router.add(HeldLoader("stuck"))
    await router.pause("finish")
    outcomes = await asyncio.wait_for(router.load_weights(LORA, timeout=0.2), 5)
    assert outcomes == {"stuck": "TimeoutError: no answer in 0.2 s"}
    assert router.list()[0]["last_error"] == "weights: TimeoutError: no answer in 0.2 s"
    assert router.paused  # left to the caller: a timed-out load may have half happened

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


class Replicas:
    """A follower (the cluster nodes' router replicas): ``drained`` is its pause's answer."""

    def __init__(self, drained: bool) -> None:
        self.drained = drained
        self.resumed: list[int | None] = []

    async def pause(self, mode: str, timeout: float | None) -> bool:
        return self.drained

    async def resume(self, policy_version: int | None) -> None:
        self.resumed.append(policy_version)

    def backend_added(self, name: str, source: str, weight: float) -> None:
        pass

    async def backend_removed(self, name: str, grace: float) -> None:
        pass


class FullLoader(HeldLoader):
    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"lora", "full"})

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        self.model = path


FULL = WeightUpdate(kind="full", path="/ckpt-full")


async def test_with_node_replicas_a_lora_is_refused_and_nothing_is_loaded():
    """Node replicas (--ray) keep the base model's name after a LoRA load: their turns
    would carry the new version but the old policy, so the load is refused."""
    router = Router(policy_version=1)
    backend = FullLoader("a")
    backend.release.set()
    router.add(backend)
    router.followers.append(Replicas(drained=True))
    await router.pause("finish")
    with pytest.raises(WeightsRefused, match="LoRA adapters are not supported with --ray"):
        await router.load_weights(LORA, timeout=5)
    assert backend.model == "base"
    assert await router.load_weights(FULL, timeout=5) == {"a": "ok"}
    assert backend.model == "/ckpt-full"


async def test_weights_load_only_once_every_node_replica_drained_at_the_pause():
    router = Router(policy_version=1)
    backend = FullLoader("a")
    router.add(backend)
    replicas = Replicas(drained=False)
    router.followers.append(replicas)
    paused = await router.pause("finish", timeout=0.1)
    assert not paused["drained"]
    with pytest.raises(WeightsRefused, match="did not drain at the last pause"):
        await router.load_weights(FULL, timeout=5)
    assert backend.model == "base"
    replicas.drained = True
    await router.pause("abort")
    assert await router.load_weights(FULL, timeout=5) == {"a": "ok"}

"""The router's weight load: only while paused, never two at once, no resume during
one, each load bounded (a server that never answers is reported, not waited on); what
later requests name after it (the adapter, or the base model after full weights) is
adopted by backends added later and by the routers that follow this one (a cluster
node's replica), without loading anything again."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from rollserve.llm.base import Generation, LLMBackend, LoadsWeights, SamplingParams, WeightsKind
from rollserve.llm.routing.router import Router
from rollserve.llm.routing.weights import WeightsRefused, WeightUpdate
from tests.waiting import eventually

LORA = WeightUpdate(kind="lora", name="policy", path="/ckpt")


class Plain(LLMBackend):
    """A token-level backend whose server takes no weights (llama.cpp, say)."""

    kind_name = "plain"

    def __init__(self, name: str) -> None:
        self.name = name

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return Generation([1], [-0.5], "stop")

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind_name, "trainable": True}


class HeldLoader(Plain, LoadsWeights):
    """A backend whose loads end when the test says so."""

    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"lora"})

    kind_name = "held"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = asyncio.Event()
        self.model: str | None = "base"
        self.loads = 0  # loads sent to its server

    async def load_lora(self, name: str, path: str) -> None:
        self.loads += 1
        await self.release.wait()
        self.model = name

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        raise NotImplementedError

    def loaded_model(self) -> str | None:
        return self.model

    def adopt(self, lora: str | None) -> None:
        self.model = lora or "base"


async def test_a_load_runs_only_while_paused_and_alone_and_holds_off_a_resume():
    router = Router(policy_version=1)
    backend = HeldLoader("a")
    router.add(backend)
    with pytest.raises(WeightsRefused, match="not paused"):
        await router.load_weights(LORA, timeout=5)
    await router.pause("finish")
    loading = asyncio.create_task(router.load_weights(LORA, timeout=5))
    await eventually(lambda: backend.loads == 1, what="the load to reach the server")
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

    async def weights_loaded(self, update: WeightUpdate, failed: list[str]) -> None:
        pass


class FullLoader(HeldLoader):
    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"lora", "full"})

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        self.loads += 1
        self.model = "base"


FULL = WeightUpdate(kind="full", path="/ckpt-full")


class Replica(Replicas):
    """A follower as a cluster node's replica is one: a router of its own whose backends
    are other objects on the same servers (``cluster.worker``)."""

    def __init__(self, router: Router) -> None:
        super().__init__(drained=True)
        self.router = router

    async def weights_loaded(self, update: WeightUpdate, failed: list[str]) -> None:
        self.router.adopt_weights(update.lora, failed)


class Broken(FullLoader):
    async def load_lora(self, name: str, path: str) -> None:
        self.loads += 1
        raise RuntimeError("No adapter found")


async def test_node_replicas_name_the_adapter_the_head_loaded_without_loading_it_again():
    """After a LoRA load on the head, every replica's backend names the adapter (each is
    another object on the same server): none samples the base model under the new
    version, and the servers get one load each. Full weights name the base model again."""
    head = Router(policy_version=1)
    a, b = FullLoader("a"), Broken("b")
    a.release.set()
    head.add(a)
    head.add(b)
    replica = Router(policy_version=1)
    twin_a, twin_b = FullLoader("a"), FullLoader("b")
    replica.add(twin_a)
    replica.add(twin_b)
    head.followers.append(Replica(replica))
    await head.pause("finish")
    outcomes = await head.load_weights(LORA, timeout=5)
    assert outcomes == {"a": "ok", "b": "RuntimeError: No adapter found"}
    # b's load failed on its server: both copies of b keep naming the base model
    assert (a.model, b.model, twin_a.model, twin_b.model) == ("policy", "base", "policy", "base")
    assert (twin_a.loads, twin_b.loads) == (0, 0)
    assert head.lora == replica.lora == "policy"
    await head.resume(policy_version=2)
    # a backend added to the replica afterwards (the head added it at run time) names it
    late = FullLoader("late")
    replica.add(late)
    assert late.model == "policy" and late.loads == 0
    await head.remove("b")
    await head.pause("finish")
    assert await head.load_weights(FULL, timeout=5) == {"a": "ok"}
    assert (a.model, twin_a.model, late.model) == ("base", "base", "base")
    assert head.lora is None and replica.lora is None


async def test_a_backend_added_after_a_lora_load_names_the_adapter_or_is_refused():
    """On one machine too: a backend added once the policy is an adapter must not sample
    the base model under the new version. One that can name it does; one that cannot
    serve an adapter is refused; none is added while a load runs."""
    router = Router(policy_version=1)
    first = FullLoader("first")
    router.add(first)
    await router.pause("finish")
    loading = asyncio.create_task(router.load_weights(LORA, timeout=5))
    await eventually(lambda: first.loads == 1, what="the load to reach the server")
    with pytest.raises(WeightsRefused, match="under way"):
        router.add(FullLoader("meanwhile"))
    first.release.set()
    assert await asyncio.wait_for(loading, 5) == {"first": "ok"}
    await router.resume(policy_version=2)
    second = FullLoader("second")
    router.add(second)
    assert second.model == "policy" and second.loads == 0
    with pytest.raises(WeightsRefused, match="cannot serve the LoRA adapter 'policy'"):
        router.add(Plain("plain"))
    assert not router.is_registered("plain") and not router.is_registered("meanwhile")
    # a replica that starts after the load (Router(lora=...)) names it from the first call
    replica = Router(policy_version=2, lora="policy")
    third = FullLoader("first")
    replica.add(third)
    assert third.model == "policy"


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


class SlowReplicas(Replicas):
    """A follower whose adoption of a load ends when the test says so."""

    def __init__(self) -> None:
        super().__init__(drained=True)
        self.release = asyncio.Event()
        self.told: list[tuple[str | None, list[str]]] = []
        self.telling = False  # weights_loaded has been called

    async def weights_loaded(self, update: WeightUpdate, failed: list[str]) -> None:
        self.telling = True
        await self.release.wait()
        self.told.append((update.lora, failed))


async def test_a_load_cancelled_while_its_followers_are_told_still_tells_them():
    """The load is in the servers once the followers' step starts: a cancel then (the
    trainer's request dropped) must neither leave a follower naming the old model nor
    let a resume through before every follower was told."""
    router = Router(policy_version=1)
    backend = HeldLoader("a")
    backend.release.set()
    router.add(backend)
    replicas = SlowReplicas()
    router.followers.append(replicas)
    await router.pause("finish")
    loading = asyncio.create_task(router.load_weights(LORA, timeout=5))
    await eventually(
        lambda: backend.model == "policy" and replicas.telling,
        what="the load in the server and its followers being told",
    )
    loading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loading
    with pytest.raises(WeightsRefused, match="under way"):
        await router.resume(policy_version=2)
    replicas.release.set()
    await eventually(lambda: replicas.told, what="the followers to be told")
    assert replicas.told == [("policy", [])]
    assert (await router.resume(policy_version=2))["policy_version"] == 2
    assert replicas.resumed == [2]

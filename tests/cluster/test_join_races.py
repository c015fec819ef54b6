"""A node's worker joining while the head's control plane moves (fake worker actors):
whatever pauses, resumes, weight loads and backend changes happen while a worker
starts, it joins in the head's state as it is when it is placed (paused while the head
is, at the head's policy version, naming the adapter the head's backends name, with
the head's backends), and nothing the head broadcasts afterwards misses it. A join's
catch-up and the head's pause, resume and weight-load broadcasts take one lock, so a
pause cannot fall between the catch-up's last look and the node's placement; the
worker's own start runs outside that lock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from rollserve.cluster import executor as executor_module  # noqa: E402
from rollserve.llm.routing.weights import WeightUpdate  # noqa: E402
from tests.cluster.test_executor_control import (  # noqa: E402
    INFO,
    LORA,
    FakeActor,
    FakeWorkerClass,
    answer,
    executor,
    node,
    report,
    scan,
)
from tests.waiting import eventually

FULL = WeightUpdate(kind="full", path="/ckpt-full")


async def test_a_pause_during_a_joins_catch_up_reaches_the_joining_node(killed, monkeypatch):
    """The worker's start spans a pause, a LoRA load and a resume to version 2; the next
    training step's pause arrives while the join tells the worker about the adapter. The
    node must join paused (the head's next load counts it as drained) and, once resumed,
    at version 2."""
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    version: list[int | None] = [1]
    ex = executor(version)
    pauses: list[asyncio.Task[bool]] = []

    async def start(*args: Any) -> Any:
        await ex.pause("finish", 1)
        await ex.weights_loaded(LORA, [])
        version[0] = 2
        await ex.resume(2)
        return await report()

    async def adopt(*args: Any) -> None:
        # The next step's pause, as the head router sends it, while this call runs.
        pauses.append(asyncio.create_task(ex.pause("finish", 1)))
        for _ in range(3):  # it runs until it waits (for the control plane's lock)
            await asyncio.sleep(0)

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(
        lambda s: made.append(FakeActor(s, start=start, weights_loaded=adopt)) or made[-1]
    )
    await scan(ex)
    (actor,) = made
    assert await asyncio.wait_for(pauses[0], 10) is True
    joined = ex.placement.current(INFO["NodeID"])
    assert joined is not None and joined.alive and ex._paused == "finish"
    assert actor.settings["policy_version"] == 1 and actor.settings["lora"] is None
    assert actor.calls["weights_loaded"] == [("policy-7", [])]
    assert actor.calls.get("pause"), "the node joined unpaused while the head is paused"
    await ex.resume(2)
    assert actor.calls["resume"][-1] == (2,)
    assert killed == []


async def test_a_worker_whose_start_spans_a_whole_weight_update_is_resumed_at_the_new_version(killed, monkeypatch):
    """Full weights (no adapter: nothing to adopt): the worker started with version 1
    must sample under version 2 once it joins, not stamp 1 on version 2's tokens."""
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    version: list[int | None] = [1]
    ex = executor(version)

    async def start(*args: Any) -> Any:
        await ex.pause("finish", 1)
        await ex.weights_loaded(FULL, [])
        version[0] = 2
        await ex.resume(2)
        return await report()

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=start)) or made[-1])
    await scan(ex)
    (actor,) = made
    joined = ex.placement.current(INFO["NodeID"])
    assert joined is not None and joined.alive
    assert actor.settings["policy_version"] == 1
    assert actor.calls.get("resume") == [(2,)]
    assert "pause" not in actor.calls and killed == []


async def test_a_worker_that_joins_while_paused_is_paused_and_resumed_with_the_others(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    version: list[int | None] = [3]
    ex = executor(version)
    await ex.pause("abort", 1)
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=report)) or made[-1])
    await scan(ex)
    (actor,) = made
    assert actor.calls["pause"] == [("abort", None)] and "resume" not in actor.calls
    version[0] = 4
    await ex.resume(4)
    assert actor.calls["resume"] == [(4,)]


async def test_a_slow_worker_start_does_not_hold_the_control_plane(killed, monkeypatch):
    """A worker that takes long to start (reaping, a tokenizer download) does not hold up
    the head's pause: its start runs outside the control plane's lock."""
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    ex.config.worker_start_timeout = 30
    released = asyncio.Event()

    async def slow_start(*args: Any) -> Any:
        await released.wait()
        return await report()

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=slow_start)) or made[-1])
    await ex._scan()
    await eventually(lambda: made and made[0].calls.get("start"), what="the worker's start")
    assert await asyncio.wait_for(ex.pause("finish", 1), 5) is True
    released.set()
    await ex.wait_started(10)
    (actor,) = made
    assert actor.calls["pause"] == [("finish", None)]


async def test_a_joining_worker_learns_which_backends_failed_to_load_the_adapter(killed, monkeypatch):
    """Their twins on the head keep their old name: so must the new worker's."""
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    await ex.weights_loaded(LORA, ["b"])
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=report)) or made[-1])
    await scan(ex)
    (first,) = made
    assert first.settings["lora"] == "policy-7" and first.settings["lora_failed"] == ["b"]
    assert "weights_loaded" not in first.calls

    # A load while the next worker starts (its settings say nothing failed): told at join.
    ex._mark_dead(ex.placement.current(INFO["NodeID"]), "its worker died")
    second_lora = WeightUpdate(kind="lora", name="policy-8", path="/ckpt8")

    async def start_during_a_load(*args: Any) -> Any:
        await ex.weights_loaded(second_lora, ["c"])
        return await report()

    ex._worker_class = FakeWorkerClass(
        lambda s: made.append(FakeActor(s, start=start_during_a_load, remove_backend=answer(None))) or made[-1]
    )
    await scan(ex)
    second = made[1]
    assert second.settings["lora_failed"] == ["b"]
    assert second.calls["weights_loaded"] == [("policy-8", ["c"])]

    # Removing the failed backend forgets it; a successful load clears the list.
    await ex.backend_removed("c", 0.0)
    assert ex._lora_failed == []
    await ex.weights_loaded(LORA, ["b"])
    await ex.weights_loaded(LORA, [])
    assert ex._lora_failed == []


async def test_full_weights_with_no_adapter_ever_in_force_tell_no_node(killed):
    ex = executor()
    slow = node(ex, "slow", FakeActor(weights_loaded=answer(None, delay=30)))
    await asyncio.wait_for(ex.weights_loaded(FULL, []), 10)
    assert "weights_loaded" not in slow.actor.calls and slow.alive and killed == []
    # After an adapter, full weights put the base model's name back everywhere.
    good = node(ex, "good", FakeActor())
    slow.alive = False
    await ex.weights_loaded(LORA, [])
    await ex.weights_loaded(FULL, ["good"])  # its load failed: it keeps the adapter's name
    assert good.actor.calls["weights_loaded"] == [("policy-7", []), (None, ["good"])]
    # The next full load that succeeds everywhere must reach it (it still names policy-7).
    await ex.weights_loaded(FULL, [])
    assert good.actor.calls["weights_loaded"][-1] == (None, [])


async def test_a_join_during_the_head_routers_own_cycle_neither_deadlocks_nor_slips(killed, monkeypatch):
    """The head's router (which calls the executor while it holds its own pause and load
    state) runs a whole update while a worker starts, and the next pause lands during
    the join's catch-up: every call returns (bounded), the node is paused with the
    others, and the next update's resume reaches it with its version."""
    from rollserve.llm.routing.router import Router
    from tests.llm.test_router_weights import FullLoader

    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    head = Router(policy_version=1)
    loader = FullLoader("a")
    loader.release.set()
    head.add(loader)
    ex = executor()
    ex._policy_version = lambda: head.policy_version
    head.followers.append(ex)
    pauses: list[asyncio.Task[dict[str, Any]]] = []

    async def start(*args: Any) -> Any:  # the trainer's step while this worker starts
        await head.pause("finish", 1)
        await head.load_weights(LORA, timeout=5)
        await head.resume(2)
        return await report()

    async def adopt(*args: Any) -> None:  # the next step's pause comes meanwhile
        pauses.append(asyncio.create_task(head.pause("finish", 1)))
        for _ in range(3):
            await asyncio.sleep(0)

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(
        lambda s: made.append(FakeActor(s, start=start, weights_loaded=adopt)) or made[-1]
    )
    await asyncio.wait_for(scan(ex), 10)
    (actor,) = made
    paused = await asyncio.wait_for(pauses[0], 10)
    assert paused["drained"] is True and actor.calls["pause"] == [("finish", 1)]
    assert await asyncio.wait_for(head.load_weights(FULL, timeout=5), 10) == {"a": "ok"}
    await asyncio.wait_for(head.resume(3), 10)
    assert actor.calls["weights_loaded"] == [("policy-7", []), (None, [])]
    # Resumed at 2 in the catch-up (the head had resumed; its next pause waited for the
    # lock), paused by that pause once placed, resumed at 3 with the others.
    assert actor.calls["resume"] == [(2,), (3,)] and killed == []

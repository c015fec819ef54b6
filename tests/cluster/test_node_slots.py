"""Waiting for a node's slot (``RayExecutor.reserve``), with fake worker actors and the
engine's scripted task family: the wait is outside INIT's pool and timeout (only the
rollout's deadline bounds it, as the pool queue on one machine), it happens again for
each new attempt after a lost node, and a rollout cancelled while waiting for a slot
or holding one leaves no slot taken."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from rollserve.cluster import executor as executor_module  # noqa: E402
from rollserve.cluster.executor import RayExecutor  # noqa: E402
from rollserve.cluster.protocol import StageCall, StageOutcome  # noqa: E402
from rollserve.commands.dataset_check import offline_context  # noqa: E402
from rollserve.engine.pipeline import Engine, EngineConfig  # noqa: E402
from rollserve.engine.pools import StagePool  # noqa: E402
from rollserve.engine.store import SQLiteStore  # noqa: E402
from tests.cluster.test_executor_control import (  # noqa: E402
    INFO,
    FakeActor,
    executor,
    healthy_workers,
    node,
    scan,
)
from tests.engine.conftest import NullRouter, OneHandlerRegistry, ScriptedHandler  # noqa: E402
from tests.engine.test_pipeline import _results, _submit  # noqa: E402
from tests.waiting import eventually


async def stage(call: StageCall) -> StageOutcome:
    """A node's worker running the scripted family's stage: it sleeps as told."""
    await asyncio.sleep(call.spec.instance.get(f"{call.stage}_sleep", 0))  # sleep-ok: a double's work
    return StageOutcome(
        reward=1.0 if call.stage == "eval" else None, evaluation={"ok": True} if call.stage == "eval" else None
    )


class Scripted(ScriptedHandler):
    """The engine tests' scripted family, as the head sees it with --ray."""

    def outside_harness(self, instance: dict[str, Any]) -> str | None:
        return None


@pytest.fixture
async def cluster_engine(tmp_path: Path) -> Any:
    engines: list[Engine] = []

    async def make(ex: RayExecutor, **config: Any) -> Engine:
        store = SQLiteStore(tmp_path / "store.db")
        await store.open()
        engine = Engine(
            store,
            OneHandlerRegistry(Scripted()),
            NullRouter(),
            EngineConfig(**config),
            offline_context(runtime="local", state_dir=tmp_path),
            executor=ex,
        )
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop()
        await engine.store.close()


async def test_a_backlog_waits_for_node_slots_outside_inits_timeout(cluster_engine):
    """One slot, three rollouts whose RUN takes longer than INIT's timeout: each waits
    for the slot (``timing.queued_node``) and completes, none times out in INIT."""
    ex = executor()
    n = node(ex, "n", FakeActor(run_stage=stage))
    n.slots = 1
    engine = await cluster_engine(ex)
    ids = await _submit(engine, {"run_sleep": 0.4}, {"run_sleep": 0.4}, {"run_sleep": 0.4}, timeouts={"init": 0.2})
    results = await _results(engine, ids, timeout=30)
    assert [r.status for r in results] == ["completed"] * 3, [r.failure for r in results]
    waited = sorted(r.timing.model_extra["queued_node"] for r in results)
    assert waited[-1] > 0.4  # the last one waited for two RUNs, outside INIT's 0.2 s
    assert all(r.timing.init < 0.2 for r in results)
    assert n.hosted == set() and ex.placement.waiting == 0


async def test_a_rollout_waiting_for_a_slot_is_bounded_by_its_total_timeout(cluster_engine):
    ex = executor()
    n = node(ex, "n", FakeActor(run_stage=stage))
    n.slots = 1
    engine = await cluster_engine(ex)
    first, second = await _submit(engine, {"run_sleep": 3}, {}, timeouts={"total": 1.0})
    done = await _results(engine, [first, second], timeout=30)
    assert done[1].status == "timed_out" and done[1].failure.stage == "queue"
    assert "rollout deadline of 1s passed in queue" in done[1].failure.message
    assert n.hosted == set() and ex.placement.waiting == 0


async def test_each_new_attempt_after_a_lost_node_waits_for_a_slot_again(cluster_engine):
    """The first node dies under RUN: the attempt's slot there is freed, and the next
    attempt is placed anew (on the node that joined)."""
    ex = executor()

    async def dies(call: StageCall) -> StageOutcome:
        if call.stage == "run":
            ex._mark_dead(first, "its raylet is gone")
        return await stage(call)

    first = node(ex, "first", FakeActor(run_stage=dies))
    engine = await cluster_engine(ex, max_attempts=2)
    (rid,) = await _submit(engine, {})
    await eventually(lambda: not first.alive, what="the first node to die under RUN")
    second = node(ex, "second", FakeActor(run_stage=stage))
    await ex.placement.changed()
    (result,) = await _results(engine, [rid], timeout=30)
    assert result.status == "completed" and result.attempt == 2
    assert first.placed == 1 and second.placed == 1
    assert first.hosted == set() and second.hosted == set()


async def test_a_cancelled_rollout_leaves_no_node_slot_taken(cluster_engine):
    """Cancelled while waiting for a node slot, and cancelled while holding one (waiting
    for INIT's pool slot): the node's slots are all free afterwards, and the worker is
    not asked to clean up a rollout it never got."""
    ex = executor()
    busy = asyncio.Event()

    async def held(call: StageCall) -> StageOutcome:
        if call.spec.instance.get("hold"):
            busy.set()
            await asyncio.sleep(30)
        return await stage(call)

    n = node(ex, "n", FakeActor(run_stage=held))
    n.slots = 2
    engine = await cluster_engine(ex, init_workers=1)
    holder, reserved, waiting = await _submit(engine, {"hold": True}, {}, {})
    await asyncio.wait_for(busy.wait(), 10)
    # holder: in INIT (pool's one slot); reserved: has the node's other slot, waits for
    # INIT's pool; waiting: no node slot free.
    await eventually(
        lambda: len(n.hosted) == 2 and ex.placement.waiting == 1 and engine.pools["init"].waiting == 1,
        what="the three rollouts placed",
    )
    assert len(n.hosted) == 2 and ex.placement.waiting == 1
    assert engine.pools["init"].waiting == 1
    assert engine.cancel(waiting) and engine.cancel(reserved)
    done = await _results(engine, [waiting, reserved], timeout=30)
    assert [r.status for r in done] == ["cancelled", "cancelled"]
    assert n.hosted == {holder} and ex.placement.waiting == 0
    assert engine.cancel(holder)
    await _results(engine, [holder], timeout=30)
    assert n.hosted == set()
    assert [c[0] for c in n.actor.calls["cleanup"]] == [holder]  # the only one it ran


async def test_a_stage_pool_resized_lets_as_many_stages_run_as_its_new_limit():
    pool = StagePool("init", 1)
    running: list[int] = []
    peak = [0]
    release = asyncio.Event()

    async def one(i: int) -> None:
        async with pool.slot():
            running.append(i)
            peak[0] = max(peak[0], len(running))
            await release.wait()
            running.remove(i)

    tasks = [asyncio.create_task(one(i)) for i in range(6)]
    await eventually(lambda: pool.waiting == 5, what="five waiting for the one slot")
    assert len(running) == 1
    pool.resize(4)
    await eventually(lambda: len(running) == 4, what="four running")
    assert pool.waiting == 2 and pool.snapshot().workers == 4
    pool.resize(2)  # the four running finish; then at most two at a time
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    release.clear()
    peak[0] = 0
    tasks = [asyncio.create_task(one(i)) for i in range(5)]
    await eventually(lambda: pool.waiting == 3, what="three waiting for the two slots")
    assert len(running) == 2
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert peak[0] == 2 and pool.busy == 0 and pool.waiting == 0


@pytest.mark.usefixtures("killed")
async def test_the_head_is_told_the_alive_nodes_slots_as_they_change(monkeypatch):
    """The server sizes its stage pools by them (``Service._size_pools``): the head's
    one-machine pool sizes must not cap a cluster with more slots."""
    infos = [INFO]
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: list(infos))
    ex = executor()
    told: list[int] = []
    ex.on_slots = told.append
    healthy_workers(ex)
    await scan(ex)
    infos.append({**INFO, "NodeID": "cd" * 28, "NodeManagerHostname": "host-b", "Resources": {"rollserve": 60.0}})
    await scan(ex)
    ex._mark_dead(ex.placement.current(INFO["NodeID"]), "its raylet is gone")
    assert told == [4, 64, 60]


def test_with_ray_the_servers_stage_pools_take_the_clusters_slots(tmp_path, monkeypatch):
    """``serve --ray``: the head's pools are sized by the alive nodes' slots as the
    executor reports them, whatever --init-workers ... said (one machine's sizes)."""
    from rollserve.cluster.protocol import RayConfig
    from rollserve.server import ServerConfig, Service

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    service = Service(
        ServerConfig(
            state_dir=tmp_path, ray=RayConfig(address="auto"), engine=EngineConfig(init_workers=8, eval_workers=4)
        )
    )
    assert service.cluster is not None and service.cluster.on_slots is not None
    service.cluster.on_slots(96)
    assert {s: p.workers for s, p in service.engine.pools.items()} == {"init": 96, "run": 96, "eval": 96}

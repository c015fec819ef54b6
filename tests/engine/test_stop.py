"""Stopping the engine with rollouts held: cancelled newest first a few per pass of the
event loop, none started on a slot freed meanwhile, every cleanup run, none finished
(a restart re-queues them all), and the wait bounded even when a rollout ignores its
cancel."""

import asyncio

import pytest

from rollserve.engine import pipeline
from rollserve.engine.pipeline import Engine
from tests.engine.conftest import ScriptedHandler
from tests.engine.test_pipeline import _submit
from tests.waiting import eventually


class GatedHandler(ScriptedHandler):
    """RUN waits for ``gate``; with ``stubborn`` it ignores the first cancel and waits
    for ``release`` (a plugin that swallows CancelledError)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, rollout):
        self.started["run"].append(rollout.id)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            if not rollout.instance.get("stubborn"):
                raise
            await self.release.wait()


@pytest.fixture
def handler():
    return GatedHandler()


async def _held(make_engine, handler, count, **config) -> tuple[Engine, list[str]]:
    engine = await make_engine(**config)
    ids = await _submit(engine, *[{} for _ in range(count)])
    await eventually(lambda: len(handler.started["run"]) == config["run_workers"], what="RUN's slots taken")
    await eventually(lambda: engine.pools["run"].waiting == count - config["run_workers"], what="the rest queued")
    return engine, ids


async def test_a_stop_starts_no_stage_on_a_slot_freed_meanwhile_and_loses_none(
    make_engine, handler, tmp_path, monkeypatch
):
    monkeypatch.setattr(pipeline, "STOP_PER_PASS", 3)  # many passes, so slots free up mid-stop
    path = tmp_path / "stop.db"
    engine, ids = await _held(make_engine, handler, 40, path=path, run_workers=2)
    holders = list(handler.started["run"])
    stopping = asyncio.create_task(engine.stop())
    await asyncio.sleep(0)  # the stop has cancelled the newest few
    assert not stopping.done()
    handler.gate.set()  # the two in RUN finish it while the rest are being cancelled
    await asyncio.wait_for(stopping, timeout=60)

    assert handler.started["run"] == holders  # no queued rollout was given a freed slot
    assert handler.started["eval"] == []  # nor went on to be scored
    assert sorted(handler.cleaned) == sorted(ids)  # each one's cleanup ran
    assert engine.pending == 0 and not engine.live
    rows = [await engine.store.rollout(i) for i in ids]
    assert all(r.result is None for r in rows)  # none finished (none scored) by the stop
    await engine.store.close()

    second = await make_engine(path=path)  # a restart re-queues every one
    assert second.status().recovered_at_start.requeued == 40
    await second.wait_finished(ids, 60)
    results = await second.store.results_after(0, 100)
    assert sorted(r.id for r in results) == sorted(ids)  # none lost, none twice
    assert {r.status for r in results} == {"completed"}


async def test_a_rollout_that_ignores_its_cancel_does_not_hold_the_stop(make_engine, handler, monkeypatch, caplog):
    monkeypatch.setattr(pipeline, "STOP_IDLE", 0.5)
    engine = await make_engine(run_workers=4)
    ids = await _submit(engine, {"stubborn": True}, {}, {})
    await eventually(lambda: len(handler.started["run"]) == 3, what="all three in RUN")
    await asyncio.wait_for(engine.stop(), timeout=60)  # (only so a hang fails the test)
    assert "1 rollouts did not end" in caplog.text
    stubborn = ids[0]
    assert set(handler.cleaned) == set(ids[1:]) and stubborn in engine.live
    handler.release.set()  # it goes on after all: to EVAL's pool, closed by the stop
    await eventually(lambda: engine.pools["eval"].waiting == 1, what="the stubborn rollout queued for EVAL")
    assert handler.started["eval"] == []  # never scored after the stop
    await asyncio.wait_for(engine.stop(), timeout=60)  # a second stop ends it, cleaned up and unfinished
    assert engine.pending == 0 and stubborn in handler.cleaned
    assert (await engine.store.rollout(stubborn)).result is None

"""``Engine.status`` reads kept counts, never a walk over every rollout in flight: the
count per status agrees with the rollouts themselves at every step, cancelled and
failed ones included, and the throughput counts what finished in its window."""

import time
from collections import Counter

from rollserve.contract import SubmitRequest
from rollserve.engine.submit import submit
from tests.waiting import eventually


def walked(engine) -> dict:
    """What the count was before: a walk over the rollouts in flight."""
    return dict(Counter(r.status for r in engine.live.values()))


async def _submit(engine, instance, n):
    request = SubmitRequest.model_validate({"tasks": [{"data_source": "scripted", "instance": instance, "n": n}]})
    return [rid for a in await submit(engine, request) for rid in a.rollout_ids]


async def test_live_counts_agree_with_the_rollouts_at_each_step(make_engine):
    engine = await make_engine(init_workers=2, run_workers=1, eval_workers=1)
    slow = await _submit(engine, {"run_sleep": 30}, n=3)
    failing = await _submit(engine, {"fail": "init"}, n=2)
    await eventually(lambda: engine.status().live.get("run") == 1, timeout=30)
    assert engine.status().live == walked(engine)
    await eventually(lambda: not set(failing) & set(engine.live), timeout=30)
    assert engine.status().live == walked(engine)
    for rid in slow:
        engine.cancel(rid)
    await engine.wait_finished(slow, 30)
    assert engine.status().live == {} == walked(engine)
    assert engine.status().finished == {"failed": 2, "cancelled": 3}
    assert engine.status().in_flight == 0


async def test_throughput_counts_the_window_only(make_engine, monkeypatch):
    engine = await make_engine()
    ids = await _submit(engine, {}, n=5)
    await engine.wait_finished(ids, 30)
    assert sum(count for _, count in engine._completions) == 5
    assert engine.throughput(60.0) > 0
    now = time.monotonic()
    with monkeypatch.context() as m:  # (no await inside: the loop never sees this clock)
        m.setattr(time, "monotonic", lambda: now + 120)
        assert engine.throughput(60.0) == 0
        assert engine.throughput(3600.0) > 0


async def test_a_status_set_before_the_engine_counts_it_is_counted_once(make_engine):
    engine = await make_engine(run_workers=1)
    ids = await _submit(engine, {"run_sleep": 30}, n=4)
    # (one runs; the others hold the status of the stage they last entered, INIT)
    await eventually(lambda: engine.status().live == {"run": 1, "init": 3} == walked(engine), timeout=30)
    assert sum(engine.status().live.values()) == engine.status().in_flight == len(ids)
    for rid in ids:
        engine.cancel(rid)
    await engine.wait_finished(ids, 30)
    assert engine.status().live == {}


async def test_counts_agree_with_the_rollouts_through_a_retry(make_engine, handler):
    """A lost node sends a rollout back to QUEUED for a new attempt from INIT: the kept
    counts follow it there and back, as a walk over the rollouts would."""
    engine = await make_engine(run_workers=1, max_attempts=3)
    ids = await _submit(engine, {"node_dies": "init", "times": 1, "run_sleep": 30}, n=3)
    await eventually(lambda: sorted(handler.started["init"]) == sorted(ids * 2), timeout=30)
    await eventually(lambda: engine.status().live.get("run") == 1, timeout=30)
    assert engine.status().live == walked(engine) == {"run": 1, "init": 2}
    assert all(engine.live[rid].attempt == 2 for rid in ids)
    for rid in ids:
        engine.cancel(rid)
    await engine.wait_finished(ids, 30)
    assert engine.status().live == {} == walked(engine)
    assert engine.status().finished == {"cancelled": 3} and engine.status().in_flight == 0

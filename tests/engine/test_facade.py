"""The engine's operations (engine.facade.Rollouts): contract models back, typed
refusals, bounded waits; no HTTP anywhere (the API maps the errors: tests/api)."""

from __future__ import annotations

import pytest

from rollserve.contract import GroupView, RolloutView, RunRequest, SubmitRequest
from rollserve.engine.errors import (
    BatchTooLarge,
    EngineError,
    InvalidTask,
    NotFound,
    QueueFull,
    UnknownDataSource,
)
from rollserve.engine.facade import Rollouts
from tests.waiting import eventually


def _batch(*instances: dict, n: int = 1, **settings) -> SubmitRequest:
    return SubmitRequest.model_validate(
        {"tasks": [{"data_source": "scripted", "instance": i, "n": n} for i in instances], **settings}
    )


@pytest.fixture
async def rollouts(make_engine):
    async def make(**config) -> Rollouts:
        return Rollouts(await make_engine(**config))

    return make


async def test_submit_watch_and_read_through_the_facade(rollouts):
    ops = await rollouts()
    (accepted,) = await ops.submit(_batch({"reward": 0.5, "run_sleep": 0.2}, n=2))
    first = await ops.rollout(accepted.rollout_ids[0])
    assert isinstance(first, RolloutView) and not first.done and first.result is None
    view = await ops.group(accepted.group_id, wait=10)
    assert isinstance(view, GroupView) and view.done and view.status_counts == {"completed": 2}
    assert [m.result.reward for m in view.rollouts] == [0.5, 0.5]
    bare = await ops.group(accepted.group_id, results=False)
    assert bare.done and [m.result for m in bare.rollouts] == [None, None]
    page = await ops.results(after=0, limit=1)
    assert [r.seq for r in page.results] == [1] and page.next == 1
    rest = await ops.results(after=page.next)
    assert [r.seq for r in rest.results] == [2] and rest.next == 2
    empty = await ops.results(after=2, wait=0.1)
    assert empty.results == [] and empty.next == 2
    status = ops.status()
    assert status.finished == {"completed": 2} and status.last_seq == 2
    assert status.handlers == ["scripted"] and status.stages["run"].done == 2


async def test_run_answers_the_group_with_its_results(rollouts):
    ops = await rollouts()
    run = RunRequest.model_validate({"task": {"data_source": "scripted", "instance": {}, "n": 2}, "wait": 10})
    answer = await ops.run(run)
    assert answer.done and [r.status for r in answer.results] == ["completed", "completed"]
    assert [r.id for r in answer.results] == [m.id for m in answer.rollouts]


async def test_refusals_are_typed_and_name_the_field(rollouts):
    ops = await rollouts(max_pending=2)
    with pytest.raises(UnknownDataSource) as unknown:
        ops.check_data_source("nope")
    assert unknown.value.field == "data_source" and "known: scripted" in unknown.value.message
    with pytest.raises(InvalidTask) as invalid:
        await ops.submit(_batch({}, {"reward": "high"}))
    assert invalid.value.field == "tasks[1].instance.reward"
    with pytest.raises(BatchTooLarge) as too_large:
        await ops.submit(_batch({}, n=3))
    assert (too_large.value.field, too_large.value.limit) == ("tasks", 2)
    await ops.submit(_batch({"run_sleep": 30}, n=2))
    with pytest.raises(QueueFull) as full:
        await ops.submit(_batch({}))
    assert full.value.retry_after > 0 and full.value.free == 0
    for missing in (ops.rollout("nope"), ops.group("nope"), ops.cancel("nope"), ops.cancel_group("nope")):
        with pytest.raises(NotFound):
            await missing
    # Every refusal is an EngineError that knows no protocol: no status code on it.
    for error in (unknown.value, invalid.value, too_large.value, full.value):
        assert isinstance(error, EngineError) and not hasattr(error, "status_code")


async def test_cancel_waits_for_the_result_and_events_are_typed(rollouts, handler):
    ops = await rollouts()
    async with ops.events() as events:
        (accepted,) = await ops.submit(_batch({"run_sleep": 60}, n=2))
        first, second = accepted.rollout_ids
        await eventually(lambda: second in handler.started["run"], what="the second in RUN")
        assert ops.total_timeout(first) == 20  # the handler's default, resolved
        cancelled = await ops.cancel(first)
        assert cancelled.cancelled and cancelled.status == "cancelled"
        assert (await ops.finished(first)).failure.message == "cancelled by the client"
        group = await ops.cancel_group(accepted.group_id)
        assert group.cancelled == [second]
        seen = []
        while not events.empty():
            event = events.get_nowait()
            seen.append((event.rollout_id, event.status, event.mask))
    assert (first, "queued", None) in seen and (first, "cancelled", True) in seen
    assert ops.total_timeout(first) is None and await ops.finished("nope") is None

import asyncio

import pytest

from rollserve.contract import SubmitRequest
from rollserve.engine.errors import Conflict, InvalidTask, QueueFull, UnknownDataSource
from rollserve.engine.submit import submit
from tests.waiting import eventually


async def _submit(engine, *instances, n=1, **batch):
    tasks = [{"data_source": "scripted", "instance": inst, "n": n} for inst in instances]
    accepted = await submit(engine, SubmitRequest.model_validate({"tasks": tasks, **batch}))
    return [rid for a in accepted for rid in a.rollout_ids]


async def _results(engine, ids, timeout=10):
    await engine.wait_finished(ids, timeout)
    rows = [await engine.store.rollout(i) for i in ids]
    assert all(r.result is not None for r in rows), [r.status for r in rows]
    return [r.result for r in rows]


async def test_completed_rollout_has_reward_and_timings(make_engine, handler):
    engine = await make_engine()
    (rid,) = await _submit(engine, {"reward": 0.5})
    (result,) = await _results(engine, [rid])
    assert result.status == "completed"
    assert result.reward == 0.5 and result.mask is False and result.failure is None
    timing = result.timing
    assert min(timing.init, timing.run, timing.eval, timing.total) > 0 and timing.queued >= 0
    assert result.evaluation == {"ok": True} and result.seq == 1
    assert handler.cleaned == [rid]


async def test_a_slow_eval_does_not_hold_a_run_slot(make_engine, handler):
    engine = await make_engine(init_workers=4, run_workers=1, eval_workers=4)
    ids = await _submit(engine, {"run_sleep": 0.05, "eval_sleep": 1.0}, n=4)
    results = await _results(engine, ids)
    assert all(r.status == "completed" for r in results)
    # Coupled (run+eval holding the one RUN worker), no RUN could start while an EVAL
    # is under way; decoupled, the next rollout's RUN starts as soon as the one before
    # leaves RUN for its 1 s EVAL. Read from the order of events, not from a clock.
    evaluating: set[str] = set()
    runs_during_an_eval = 0
    for edge, stage, rid in handler.events:
        if stage == "eval":
            (evaluating.add if edge == "start" else evaluating.discard)(rid)
        elif stage == "run" and edge == "start" and evaluating:
            runs_during_an_eval += 1
    assert runs_during_an_eval >= 1, handler.events


@pytest.mark.parametrize(
    "instance, status, kind, stage, mask, reward",
    [
        ({"fail": "init"}, "failed", "infra", "init", True, None),
        ({"fail": "eval"}, "failed", "infra", "eval", True, None),
        ({"fail": "run", "fail_kind": "agent"}, "failed", "agent", "run", False, 0.0),
        ({"crash": "run"}, "failed", "infra", "run", True, None),
        # A scoring worker killed past its timeout (the plugin API's ScoringTimeout, an
        # AgentError that is also a TimeoutError): the agent's failure, scored, not a
        # timeout of the rollout propagating out of the pipeline.
        ({"fail": "eval", "fail_kind": "scoring_timeout"}, "failed", "agent", "eval", False, 0.0),
    ],
)
async def test_failures_are_typed_and_infra_is_masked(
    make_engine, handler, instance, status, kind, stage, mask, reward
):
    engine = await make_engine()
    (rid,) = await _submit(engine, instance)
    (result,) = await _results(engine, [rid])
    assert result.status == status
    assert result.failure.kind == kind and result.failure.stage == stage
    assert result.mask is mask
    assert result.reward == reward
    assert handler.cleaned == [rid]


async def test_stage_timeout_and_total_deadline_are_typed(make_engine):
    engine = await make_engine()
    stage_ids = await _submit(engine, {"run_sleep": 30}, timeouts={"run": 0.2})
    total_ids = await _submit(engine, {"init_sleep": 0.1, "run_sleep": 30}, timeouts={"total": 0.3})
    (stage_result,) = await _results(engine, stage_ids)
    (total_result,) = await _results(engine, total_ids)
    assert stage_result.status == "timed_out"
    assert stage_result.failure.stage == "run" and stage_result.failure.kind == "timeout"
    assert "0.2s" in stage_result.failure.message and stage_result.mask is True
    assert total_result.status == "timed_out"
    assert "deadline" in total_result.failure.message


async def test_cancel_stops_work_in_flight_and_runs_cleanup(make_engine, handler):
    engine = await make_engine()
    (rid,) = await _submit(engine, {"run_sleep": 60})
    await eventually(lambda: rid in handler.started["run"], what="the rollout in RUN")
    assert engine.cancel(rid) is True
    (result,) = await _results(engine, [rid])  # within 10 s: only the cancel ends a 60 s run
    assert result.status == "cancelled" and result.failure.stage == "run"
    assert result.mask is True
    assert handler.cleaned == [rid]
    assert engine.cancel(rid) is False


async def test_full_queue_refuses_the_whole_batch(make_engine):
    engine = await make_engine(max_pending=3)
    await _submit(engine, {"run_sleep": 5}, n=2)
    with pytest.raises(QueueFull) as info:
        await _submit(engine, {}, n=2)
    assert info.value.retry_after > 0 and (info.value.wanted, info.value.free) == (2, 1)
    assert len(engine.live) == 2


async def test_bad_instance_and_unknown_source_name_the_field(make_engine):
    engine = await make_engine()
    with pytest.raises(InvalidTask) as info:
        await _submit(engine, {}, {"reward": "high"})
    assert info.value.field == "tasks[1].instance.reward" and info.value.message == "must be a number"
    request = SubmitRequest.model_validate({"tasks": [{"data_source": "nope", "instance": {}}]})
    with pytest.raises(UnknownDataSource) as info:
        await submit(engine, request)
    assert info.value.field == "tasks[0].data_source" and "known: scripted" in info.value.message
    assert engine.live == {}


async def test_client_ids_make_retries_idempotent(make_engine):
    engine = await make_engine()
    body = {"tasks": [{"id": "t-1", "data_source": "scripted", "instance": {}, "n": 2}]}
    first = await submit(engine, SubmitRequest.model_validate(body))
    again = await submit(engine, SubmitRequest.model_validate(body))
    assert again[0].duplicate and again[0].rollout_ids == first[0].rollout_ids
    body["tasks"][0]["n"] = 3
    with pytest.raises(Conflict) as info:
        await submit(engine, SubmitRequest.model_validate(body))
    assert info.value.field == "tasks[0].id"


@pytest.mark.parametrize("policy, expected", [("requeue", "completed"), ("interrupt", "interrupted")])
async def test_restart_requeues_or_interrupts_unfinished_rollouts(make_engine, tmp_path, handler, policy, expected):
    path = tmp_path / "restart.db"
    first = await make_engine(path=path)
    done = await _submit(first, {})
    await _results(first, done)
    ids = await _submit(first, {"run_sleep": 0.5}, n=3)
    await eventually(lambda: len(handler.started["run"]) >= 1 + 3, what="the three in RUN")
    await first.stop()  # as if the server died: nothing is finished
    await first.store.close()

    second = await make_engine(path=path, on_restart=policy)
    results = await _results(second, ids)
    assert {r.status for r in results} == {expected}
    if expected == "interrupted":
        assert all(r.mask and r.failure.kind == "infra" for r in results)
    else:
        assert all(r.attempt == 2 for r in results)
    rows = await second.store.results_after(0, 100)
    assert sorted(r.id for r in rows) == sorted(done + ids)  # none lost, none twice
    recovered = second.status().recovered_at_start
    assert (recovered.requeued, recovered.interrupted) == ((3, 0) if policy == "requeue" else (0, 3))


async def test_a_store_failure_on_the_result_frees_the_slot_and_wakes_waiters(make_engine, monkeypatch):
    engine = await make_engine(max_pending=1)

    async def broken_finish(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(engine.store, "finish", broken_finish)
    (rid,) = await _submit(engine, {})
    # Woken by the failed finish, not by its own (10-minute) timeout: the 60 s bound
    # fails the test if nothing wakes it.
    await asyncio.wait_for(engine.wait_finished([rid], 600), 60)
    assert engine.pending == 0 and engine.room() == 1  # not leaked as in flight
    monkeypatch.undo()
    row = await engine.store.rollout(rid)
    assert row.result is None  # unfinished in the store: the next start recovers it


async def test_what_a_handler_leaves_is_made_to_fit_the_contract_or_failed_as_infra(make_engine):
    """A plugin's evaluation is stored as JSON (tuples as lists, keys as strings, what
    JSON cannot hold as its repr); a stat that is not a count fails the rollout as
    infra (masked, unscored) instead of leaving it unfinished, re-run at every start."""
    engine = await make_engine()
    odd, fractional = await _submit(engine, {"odd_details": True}, {"stats": {"steps": 2.5}})
    odd_result, bad_result = await _results(engine, [odd, fractional])
    assert odd_result.status == "completed" and odd_result.reward == 1.0
    assert odd_result.evaluation == {"ok": True, "pair": [1, 2], "by_id": {"7": "x"}, "seen": "{3}"}
    assert bad_result.status == "failed" and bad_result.mask and bad_result.reward is None
    assert bad_result.failure.kind == "infra" and "stats.steps" in bad_result.failure.message
    assert bad_result.evaluation is None and "steps" not in bad_result.stats.model_extra
    assert engine.counters == {"completed": 1, "failed": 1}


async def test_a_rollout_cancelled_before_it_begins_ends_cancelled(make_engine, handler):
    """A cancel that comes before the rollout's task first runs (submit, then cancel,
    with no step of the event loop between: a client's DELETE right after its POST)
    ends it cancelled and frees its slot, not queued for ever."""
    engine = await make_engine()
    (rid,) = await _submit(engine, {"run_sleep": 60})
    assert engine.cancel(rid) is True  # its task has not taken a step yet
    (result,) = await _results(engine, [rid])
    assert result.status == "cancelled" and result.failure.kind == "infra"
    assert rid not in handler.started["init"]  # no stage began
    assert engine.pending == 0 and engine.room() > 0

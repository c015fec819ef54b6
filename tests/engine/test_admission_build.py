"""What admission builds for a batch without validating its own objects again: specs
that read back from the store as the models they were, each sample with its own
instance, a fingerprint where a client key can be looked up, and the in-flight count
kept by each rollout's status from the moment it is counted."""

from __future__ import annotations

from collections import Counter

from rollserve.contract import SubmitRequest
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.engine.submit import submit
from tests.waiting import eventually


def _batch(*tasks: dict) -> SubmitRequest:
    return SubmitRequest.model_validate(
        {
            "tasks": list(tasks),
            "sampling": {"max_tokens": 7, "seed": 3},
            "timeouts": {"total": 15.0},
        }
    )


async def test_specs_read_back_from_the_store_as_built_each_sample_its_own(make_engine, handler):
    engine = await make_engine()
    instance = {"reward": 0.5, "run_sleep": 30, "nested": {"k": [1, 2]}, "text": 'é "q" \\'}
    request = _batch(
        {"data_source": "scripted", "n": 3, "instance": instance, "metadata": {"m": 1}, "sampling": {"seed": 9}},
        {"data_source": "scripted", "n": 1, "instance": {"reward": 1.0, "run_sleep": 30}, "id": "key-1"},
    )
    first, second = await submit(engine, request)
    live = [engine.live[rid] for rid in first.rollout_ids]
    for index, rollout in enumerate(live):
        row = await engine.store.rollout(rollout.id)
        assert row is not None
        stored = RolloutSpec.model_validate_json(row.spec.model_dump_json())
        assert stored == rollout.spec == RolloutSpec.model_validate(rollout.spec.model_dump())
        assert rollout.spec.instance == instance and rollout.spec.sample_index == index
        assert rollout.spec.sampling.seed == 9 + index and rollout.spec.sampling.max_tokens == 7
        assert rollout.timeouts.total == 15.0
    # A handler that changes one sample's instance changes no other sample's.
    live[0].spec.instance["reward"] = -1
    assert [r.spec.instance["reward"] for r in live[1:]] == [0.5, 0.5]
    assert request.tasks[0].instance["reward"] == 0.5
    # Only a keyed task's fingerprint is ever compared: only it stores one.
    keyed = await engine.store.group_by_client_key("key-1")
    assert keyed is not None and keyed.id == second.group_id and len(keyed.request_hash) == 64
    found = await engine.store.group(first.group_id, results=False)
    assert found is not None and found[0].request_hash == ""
    for rid in first.rollout_ids + second.rollout_ids:
        engine.cancel(rid)
    await eventually(lambda: engine.pending == 0, timeout=30)


def test_a_rollouts_status_is_counted_once_its_tally_is_set():
    spec = RolloutSpec(id="g-0", group_id="g", task_id="g", data_source="scripted", sample_index=0, instance={})
    tally: Counter[str] = Counter()
    rollout = Rollout(spec=spec, status="init")
    assert rollout.tally is None and rollout.status == "init" and not tally
    rollout.status = "run"  # not counted yet
    rollout.tally = tally  # type: ignore[assignment]
    assert tally == Counter({"run": 1})
    rollout.status = "eval"
    assert +tally == Counter({"eval": 1})
    rollout.tally = None
    rollout.status = "completed"
    assert +tally == Counter({"eval": 1})
    assert "tally" not in repr(rollout)
    assert rollout == Rollout(spec=spec, status="completed", created_at=rollout.created_at)

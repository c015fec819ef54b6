"""A node's worker (``NodeWorker``, here in this process, not as an actor), with real
bubblewrap sandboxes: a stage call that comes after its attempt's cleanup (a cancelled
INIT still queued at the actor runs anyway) is refused and makes no sandbox; a hosted
rollout whose deadline passed long ago with no stage running and no cleanup from the
head is cleaned up by the worker's janitor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollserve.cluster.protocol import StageCall, WorkerSettings
from rollserve.cluster.worker import NodeWorker
from rollserve.contract import Stage, Timeouts
from rollserve.engine.rollout import RolloutSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

TESTS = [{"input": "1 2\n", "output": "3\n"}]


@pytest.fixture
async def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NodeWorker]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = WorkerSettings(
        node="n1", state_dir=tmp_path, tokenizer="smollm2", scoring_workers=1, orphan_grace=0.5, janitor_s=0.1
    )
    w = NodeWorker(settings.model_dump_json())
    await w.start()
    try:
        yield w
    finally:
        await asyncio.wait_for(w.stop(), 60)


def call(
    rid: str,
    stage: Stage,
    attempt: int = 1,
    left: float = 60.0,
    data_source: str = "code",
    instance: dict | None = None,
) -> StageCall:
    """One stage of a rollout as the head sends it to a node (a code task by default)."""
    spec = RolloutSpec(
        id=rid,
        group_id="g",
        task_id="t",
        sample_index=0,
        data_source=data_source,
        instance=instance if instance is not None else {"problem": "print the sum of two integers", "tests": TESTS},
        sampling={},
    )
    return StageCall(
        spec=spec,
        attempt=attempt,
        stage=stage,
        max_turns=2,
        max_context_tokens=4096,
        timeouts=Timeouts(),
        max_staleness=None,
        mask_stale=False,
        rollout_left=left,
        calls_left=left,
        run_left=None,
    )


def records(w: NodeWorker) -> list[Path]:
    return list((w.settings.node_state_dir / "sandboxes").glob("*.json"))


async def test_an_init_that_comes_after_its_cleanup_is_refused_and_opens_no_sandbox(worker):
    assert await worker.cleanup("r1", 1, produced=False) is None  # not hosted (yet)
    outcome = await worker.run_stage(call("r1", "init"))
    assert outcome.error is not None and outcome.error.kind == "infra"
    assert "cleaned up on node n1 before this init call came" in outcome.error.message
    assert worker.rollouts == {} and worker.sandboxes.open_sandboxes() == [] and records(worker) == []
    # The next attempt is the head's to send, and runs.
    outcome = await worker.run_stage(call("r1", "init", attempt=2))
    assert outcome.error is None and len(worker.sandboxes.open_sandboxes()) == 1
    await worker.cleanup("r1", 2, produced=False)
    assert worker.sandboxes.open_sandboxes() == [] and records(worker) == []


async def test_an_earlier_attempt_still_hosted_is_cleaned_up_at_the_next_attempts_init(worker):
    assert (await worker.run_stage(call("r1", "init"))).error is None
    (first,) = worker.sandboxes.open_sandboxes()
    assert (await worker.run_stage(call("r1", "init", attempt=2))).error is None
    assert first.closed and len(worker.sandboxes.open_sandboxes()) == 1
    late = await worker.run_stage(call("r1", "run", attempt=1))
    assert late.error is not None and "attempt 1 was cleaned up" in late.error.message


async def test_a_rollout_the_head_forgot_is_cleaned_up_by_the_janitor_after_its_deadline(worker):
    assert (await worker.run_stage(call("r1", "init", left=0.2))).error is None
    assert len(worker.sandboxes.open_sandboxes()) == 1 and records(worker)
    # deadline 0.2 s + grace 0.5 s, looked at every 0.1 s
    await eventually(lambda: not worker.rollouts, what="the janitor to clean up r1")
    assert worker.rollouts == {} and worker.orphans == 1
    assert worker.sandboxes.open_sandboxes() == [] and records(worker) == []
    late = await worker.run_stage(call("r1", "run"))  # the head's call, much too late
    assert late.error is not None and worker.sandboxes.open_sandboxes() == []


async def test_a_hosted_rollout_within_its_deadline_is_left_alone(worker):
    assert (await worker.run_stage(call("r1", "init", left=60))).error is None
    # A forgotten one beside it: once the janitor has cleaned that up, it has looked at
    # r1 past the time it would have, were r1 forgotten too.
    assert (await worker.run_stage(call("r2", "init", left=0.2))).error is None
    await eventually(lambda: "r2" not in worker.rollouts, what="the janitor to clean up r2")
    assert "r1" in worker.rollouts and worker.orphans == 1
    assert len(worker.sandboxes.open_sandboxes()) == 1

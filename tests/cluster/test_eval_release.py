"""An attempt's EVAL is its last stage: the node's worker cleans the attempt up as the
stage ends and then answers (``StageCall.release``), so the head sends no cleanup call
of its own after it (one request and one round trip fewer per rollout). The attempt
stays cleaned up: a stage call for it that comes later (sent again, or forged) is
refused and hosts nothing. An EVAL that did not return (cut by a deadline or a cancel)
is cleaned up by the head as before."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from rollserve.cluster.protocol import LinkItem, LinkReply, StageCall, StageOutcome  # noqa: E402
from rollserve.cluster.worker import NodeWorker  # noqa: E402
from tests.cluster.test_executor_control import FakeActor, executor, node, rollout  # noqa: E402
from tests.cluster.test_link import math_call  # noqa: E402
from tests.waiting import eventually  # noqa: E402


async def _answer(w: NodeWorker, item: LinkItem, ack: int) -> LinkReply:
    """Send ``item`` to the worker and take its answer (acknowledging up to ``ack``)."""
    taken = await w.exchange(pickle.dumps([item]), ack, 5.0)

    async def answered() -> bool:
        taken[:] = [r for r in await w.exchange(None, ack, 5.0) if r.id == item.id]
        return bool(taken)

    if not [r for r in taken if r.id == item.id]:
        await eventually(answered, what=f"the answer to request {item.id}")
    return next(r for r in taken if r.id == item.id)


def _release(call: StageCall) -> StageCall:
    call.release = True
    return call


async def test_the_worker_cleans_an_attempt_up_before_it_answers_its_eval_and_refuses_it_after(worker):
    init = await _answer(worker, LinkItem(id=1, call=math_call("r1", "init")), 0)
    assert init.error is None and init.outcome is not None and init.outcome.error is None
    assert "r1" in worker.rollouts
    evaluated = await _answer(worker, LinkItem(id=2, call=_release(math_call("r1", "eval"))), init.seq)
    assert evaluated.error is None and evaluated.outcome is not None  # the stage's own answer
    assert "r1" not in worker.rollouts and ("r1", 1) in worker._cleaned
    # The same attempt's stages again (a head's retry, or a forged request): refused, nothing hosted.
    for i, stage in enumerate(("run", "eval", "init"), start=3):
        again = await _answer(worker, LinkItem(id=i, call=math_call("r1", stage)), evaluated.seq)
        assert again.outcome is not None and again.outcome.error is not None
        assert again.outcome.error.kind == "infra" and "cleaned up" in again.outcome.error.message
        assert "r1" not in worker.rollouts
    # An EVAL without ``release`` (an older head's) leaves the attempt hosted for its cleanup call.
    await _answer(worker, LinkItem(id=10, call=math_call("r2", "init")), 0)
    await _answer(worker, LinkItem(id=11, call=math_call("r2", "eval")), 0)
    assert "r2" in worker.rollouts


def _cleanups(fake: FakeActor) -> list[Any]:
    return [item.cleanup for batch in fake.batches for item in batch if item.cleanup is not None]


async def test_the_head_sends_no_cleanup_after_an_answered_eval(killed):
    ex = executor()
    fake = FakeActor(run_stage=lambda call: _outcome())
    n = node(ex, "n", fake)
    r = rollout("r1")
    ex._where[r.id] = n
    n.hosted.add(r.id)
    for stage in ("init", "run", "eval"):
        await asyncio.wait_for(ex.run_stage(r, handler=None, stage=stage), 10)  # type: ignore[arg-type]
    stages = [(item.call.stage, item.call.release) for batch in fake.batches for item in batch if item.call]
    assert stages == [("init", False), ("run", False), ("eval", True)]
    assert fake.calls["cleanup"] == [("r1", 1, False)]  # the node's own, as it answered the EVAL
    await asyncio.wait_for(ex.cleanup(r, handler=None), 10)  # type: ignore[arg-type]
    assert _cleanups(fake) == [] and fake.calls["cleanup"] == [("r1", 1, False)]
    assert n.hosted == set() and r.id not in ex._where and r.id not in ex._released
    await ex._link(n).aclose()


async def test_an_eval_cut_before_its_answer_is_cleaned_up_by_the_head(killed):
    ex = executor()
    started = asyncio.Event()

    async def stage(call: StageCall) -> StageOutcome:
        if call.stage == "eval":
            started.set()
            await asyncio.Event().wait()  # never answers: the head's deadline cuts it
        return StageOutcome()

    fake = FakeActor(run_stage=stage)
    n = node(ex, "n", fake)
    r = rollout("r1")
    ex._where[r.id] = n
    n.hosted.add(r.id)
    await asyncio.wait_for(ex.run_stage(r, handler=None, stage="init"), 10)  # type: ignore[arg-type]
    cut = asyncio.create_task(ex.run_stage(r, handler=None, stage="eval"))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 10)
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut
    await asyncio.wait_for(ex.cleanup(r, handler=None), 10)  # type: ignore[arg-type]
    assert _cleanups(fake) == [("r1", 1, True)]  # what it had produced is asked back
    assert n.hosted == set()
    await ex._link(n).aclose()


async def _outcome() -> StageOutcome:
    return StageOutcome()


async def test_the_nodes_cleanup_and_the_heads_meet_and_clean_once(worker):
    """The head's wait for an EVAL cut while the node's own cleanup runs: its cleanup
    call waits for that one, and the attempt is cleaned up once, not twice at once."""
    real, calls, started, go_on = worker.executor.cleanup, [], asyncio.Event(), asyncio.Event()

    async def slow_cleanup(r, handler):  # a sandbox that takes a while to close
        calls.append(r.id)
        started.set()
        await asyncio.wait_for(go_on.wait(), 30)
        await real(r, handler)

    worker.executor.cleanup = slow_cleanup
    init = await _answer(worker, LinkItem(id=1, call=math_call("r1", "init")), 0)
    assert init.error is None and init.outcome is not None and init.outcome.error is None
    eval_call = math_call("r1", "eval")
    eval_call.release = True
    await worker.exchange(pickle.dumps([LinkItem(id=2, call=eval_call)]), 1, 0.0)
    await asyncio.wait_for(started.wait(), 30)  # the node's own cleanup is under way
    heads = asyncio.create_task(worker.cleanup("r1", 1, True))
    await asyncio.sleep(0)
    assert not heads.done()  # it waits for the cleanup in flight
    go_on.set()
    assert (await asyncio.wait_for(heads, 30)) is not None
    assert calls == ["r1"] and "r1" not in worker.rollouts

"""The head's batched traffic with a node's worker (``cluster.link``): stage calls that
start together go in one Ray call and their answers come back in one poll, each to its
own rollout; a request cancelled before its batch left is never sent; a poll's answer
that is lost is sent again (the worker keeps answers until a poll acknowledges them); a
worker that dies fails every request waiting on it as a lost node, while a request that
cannot be pickled, or a poll that fails for another reason, fails only its own requests
(polls that keep failing fail them all). The worker's side
(``NodeWorker.submit``, ``take_replies``) runs here in this process, on math rollouts."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from ray.exceptions import ActorDiedError, RaySystemError  # noqa: E402

from rollserve.cluster import link as link_module  # noqa: E402
from rollserve.cluster.protocol import LinkItem, StageCall, StageOutcome  # noqa: E402
from rollserve.contract import Stage  # noqa: E402
from rollserve.errors import InfraError, NodeLost  # noqa: E402
from tests.cluster.test_executor_control import FakeActor, executor, node, rollout  # noqa: E402
from tests.cluster.test_worker_cleanup import call  # noqa: E402
from tests.waiting import eventually  # noqa: E402


def math_call(rid: str, stage: Stage, attempt: int = 1) -> StageCall:
    return call(rid, stage, attempt, data_source="math", instance={"question": "What is 1 + 1?", "answer": "2"})


async def stages_on_one_node(
    ex: Any, stage: Any, count: int, name: str
) -> tuple[Any, list[Any], list[asyncio.Task[Any]]]:
    """A node whose actor runs ``stage`` and ``count`` rollouts on it, their ``name`` stage
    started: (node, rollouts, tasks), once every one has reached the node."""
    n = node(ex, "n", FakeActor(run_stage=stage))
    rollouts = [rollout(f"r{i}") for i in range(count)]
    for r in rollouts:
        ex._where[r.id] = n
    running = [asyncio.create_task(ex.run_stage(r, handler=None, stage=name)) for r in rollouts]
    await eventually(
        lambda: len(n.actor.calls.get("run_stage", [])) == count, what=f"the {count} stages to reach the node"
    )
    return n, rollouts, running


async def test_a_workers_answers_come_in_polls_and_stay_until_acknowledged(worker):
    batch = [
        LinkItem(id=1, call=math_call("r1", "init")),
        LinkItem(id=2, call=math_call("r2", "init")),
        LinkItem(id=3, call=math_call("r3", "run")),  # never INIT'd here: refused
    ]
    taken = await worker.exchange(pickle.dumps(batch), 0, 5.0)  # the first answer, maybe more

    async def answers(count: int, ack: int) -> bool:
        taken[:] = await worker.exchange(None, ack, 5.0)
        return len(taken) == count

    await eventually(lambda: answers(3, 0), what="the three answers")
    by_id = {reply.id: reply for reply in taken}
    assert sorted(r.seq for r in taken) == [1, 2, 3] and all(r.error is None for r in taken)
    assert by_id[1].outcome is not None and by_id[1].outcome.error is None
    assert by_id[2].outcome is not None and by_id[2].outcome.error is None
    assert by_id[3].outcome is not None and by_id[3].outcome.error is not None
    assert "not hosted" in by_id[3].outcome.error.message
    # Not acknowledged: the same answers again (a poll whose answer was lost).
    assert [r.id for r in await worker.exchange(None, 0, 0.0)] == [r.id for r in taken]
    assert [r.id for r in await worker.exchange(None, 2, 0.0)] == [taken[-1].id]
    # One that only delivers (wait 0) takes none, though seq 3 is not acknowledged: the
    # head's wait on its way takes them, and each answer crosses once.
    assert await worker.exchange(pickle.dumps([LinkItem(id=4, cleanup=("r1", 1, True))]), 2, 0.0) == []
    await eventually(lambda: answers(1, 3), what="the cleanup's answer")
    (cleaned,) = taken
    assert cleaned.id == 4 and cleaned.seq == 4 and cleaned.outcome is not None  # what r1 had produced
    assert await worker.exchange(None, 4, 0.0) == []
    assert "r1" not in worker.rollouts and "r2" in worker.rollouts
    assert not worker._replies


async def test_stages_that_start_together_share_one_call_and_their_answers_one_poll(killed):
    ex = executor()
    released = asyncio.Event()

    async def stage(call: StageCall) -> StageOutcome:
        await released.wait()
        return StageOutcome(reward=float(call.spec.id.removeprefix("r")))

    n, rollouts, running = await stages_on_one_node(ex, stage, 20, "eval")
    released.set()
    await asyncio.wait_for(asyncio.gather(*running), 10)
    assert [r.reward for r in rollouts] == [float(i) for i in range(20)]  # each its own answer
    assert [len(batch) for batch in n.actor.batches] == [20]
    assert len(n.actor.calls["exchange"]) <= 3  # the one that carried them (and its acknowledgement)


async def _requests_made_while_the_poll_waits() -> list[list[str]]:
    """r0's exchange waits on the node (its stage runs); r1 goes at once in an exchange of
    its own, which the node holds; r2 and r3, made meanwhile, wait for it and go together
    (returned: the stages each exchange carried)."""
    ex = executor()
    r0_done, delivered = asyncio.Event(), asyncio.Event()

    async def stage(call: StageCall) -> StageOutcome:
        if call.spec.id == "r0":
            await r0_done.wait()
        return StageOutcome()

    fake = FakeActor(run_stage=stage)
    exchange = fake.replies["exchange"]

    async def holds_the_second_batch(payload: bytes | None, ack: int, wait: float) -> Any:
        replies = await exchange(payload, ack, wait)
        if payload is not None and len(fake.batches) == 2:
            await delivered.wait()
        return replies

    fake.replies["exchange"] = holds_the_second_batch
    n = node(ex, "n", fake)
    rollouts = [rollout(f"r{i}") for i in range(4)]
    for r in rollouts:
        ex._where[r.id] = n
    running = [asyncio.create_task(ex.run_stage(rollouts[0], handler=None, stage="init"))]  # type: ignore[arg-type]
    await eventually(lambda: len(fake.batches) == 1, what="r0's exchange")
    running.append(asyncio.create_task(ex.run_stage(rollouts[1], handler=None, stage="init")))  # type: ignore[arg-type]
    await eventually(lambda: len(fake.batches) == 2, what="r1's exchange")
    running += [asyncio.create_task(ex.run_stage(r, handler=None, stage="init")) for r in rollouts[2:]]  # type: ignore[arg-type]
    for _ in range(100):  # r2 and r3 made, and held while r1's exchange is out
        if n.busy["init"] == 4:
            break
        await asyncio.sleep(0)
    assert n.busy["init"] == 4 and len(fake.batches) == 2
    delivered.set()
    r0_done.set()
    await asyncio.wait_for(asyncio.gather(*running), 10)
    return [[item.call.spec.id for item in batch if item.call] for batch in fake.batches]


async def test_requests_made_while_the_poll_waits_go_at_once_and_then_together(killed, monkeypatch):
    monkeypatch.setattr(link_module, "HOLD_S", 30.0)  # no timer sends them: r1's return does
    assert await _requests_made_while_the_poll_waits() == [["r0"], ["r1"], ["r2", "r3"]]


def test_the_link_runs_on_uvloop_as_the_server_does(killed, monkeypatch):
    """The server's loop is uvloop, whose ``call_later(0)`` gives a plain ``Handle``."""
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.setattr(link_module, "HOLD_S", 30.0)
    loop = uvloop.new_event_loop()
    try:
        sent = loop.run_until_complete(asyncio.wait_for(_requests_made_while_the_poll_waits(), 30))
    finally:
        loop.close()
    assert sent == [["r0"], ["r1"], ["r2", "r3"]]


async def test_a_request_cancelled_before_its_batch_left_is_never_sent(killed, monkeypatch):
    monkeypatch.setattr(link_module, "BATCH_S", 2.0)  # the batch leaves 2 s after its first request
    ex = executor()
    n = node(ex, "n", FakeActor(run_stage=lambda call: _outcome()))
    first, second = rollout("r1"), rollout("r2")
    ex._where[first.id] = ex._where[second.id] = n
    cancelled = asyncio.create_task(ex.run_stage(first, handler=None, stage="init"))  # type: ignore[arg-type]
    kept = asyncio.create_task(ex.run_stage(second, handler=None, stage="init"))  # type: ignore[arg-type]
    for _ in range(100):  # both requests made (a few turns of the loop)
        if n.busy["init"] == 2:
            break
        await asyncio.sleep(0)
    assert n.busy["init"] == 2 and "submit" not in n.actor.calls
    cancelled.cancel()
    await asyncio.wait_for(kept, 10)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    sent = [item.call.spec.id for batch in n.actor.batches for item in batch if item.call is not None]
    assert sent == ["r2"]
    assert n.busy["init"] == 0


async def _outcome() -> StageOutcome:
    return StageOutcome()


async def test_a_poll_whose_answer_is_lost_is_asked_again_and_the_answer_comes(killed, monkeypatch):
    monkeypatch.setattr(link_module, "POLL_WAIT_S", 0.1)
    ex = executor()  # call_timeout 0.2 s: a poll is given up after 0.3 s
    polls: list[int] = []  # each poll's ack
    lost: list[int] = []
    fake = FakeActor(run_stage=lambda call: _outcome())
    answer = fake.replies["exchange"]

    async def loses_the_first_answer(payload: bytes | None, ack: int, wait: float) -> Any:
        replies = await answer(payload, ack, wait)
        polls.append(ack)
        if replies and not lost:
            lost.append(ack)
            await asyncio.Event().wait()  # this answer never arrives: the head's bound ends it
        return replies

    fake.replies["exchange"] = loses_the_first_answer
    n = node(ex, "n", fake)
    r = rollout("r1")
    ex._where[r.id] = n
    await asyncio.wait_for(ex.run_stage(r, handler=None, stage="init"), 10)  # type: ignore[arg-type]
    assert lost == [0] and polls.count(0) >= 2  # asked again, with nothing acknowledged
    assert len(fake.batches) == 1  # the stage itself was sent once


async def test_a_worker_that_dies_fails_every_request_waiting_on_it_as_a_lost_node(killed):
    ex = executor()
    released = asyncio.Event()

    async def stage(call: StageCall) -> StageOutcome:
        if call.spec.id == "r0":
            await released.wait()
            raise ActorDiedError()
        await asyncio.Event().wait()  # the others never finish: the death ends them
        raise AssertionError("unreachable")

    n, _, running = await stages_on_one_node(ex, stage, 5, "run")
    released.set()
    outcomes = await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 10)
    assert all(isinstance(o, NodeLost) for o in outcomes), outcomes
    assert not n.alive and n.lost == 5
    assert ex._links == {}


def test_a_send_due_at_once_is_kept_on_uvloop(killed):
    """uvloop (the server's loop) answers ``call_later(0)`` with a plain ``Handle``, which
    has no ``when()``: a request made while such a send is due keeps it (no error)."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        ex = executor()
        link = ex._link(node(ex, "n", FakeActor()))
        link._schedule(0.0)
        due = link._flush
        link._schedule(link_module.BATCH_S)  # what a request made now does
        assert link._flush is due
        link.close("the test is over")

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(), 30))
    finally:
        loop.close()


async def test_a_request_that_cannot_be_pickled_fails_alone_and_the_link_goes_on(killed):
    """A request the head cannot pickle fails its own caller (an infra error, never
    sent); the one that shared its exchange, and a later one, are answered."""
    ex = executor()
    fake = FakeActor(run_stage=lambda call: _outcome())
    n = node(ex, "n", fake)
    bad, shared, later = rollout("bad"), rollout("shared"), rollout("later")
    bad.spec.instance["f"] = lambda: 0  # not picklable
    for r in (bad, shared, later):
        ex._where[r.id] = n
    outcomes = await asyncio.wait_for(
        asyncio.gather(
            ex.run_stage(bad, handler=None, stage="init"),  # type: ignore[arg-type]
            ex.run_stage(shared, handler=None, stage="init"),  # type: ignore[arg-type]
            return_exceptions=True,
        ),
        10,
    )
    assert isinstance(outcomes[0], InfraError) and "could not be sent" in str(outcomes[0]), outcomes
    assert outcomes[1] is None
    await asyncio.wait_for(ex.run_stage(later, handler=None, stage="init"), 10)  # type: ignore[arg-type]
    sent = [[item.call.spec.id for item in batch if item.call is not None] for batch in fake.batches]
    assert sent == [["shared"], ["later"]]
    assert n.alive and n.busy["init"] == 0
    await ex._link(n).aclose()


async def test_a_failed_poll_fails_only_the_requests_it_carried(killed):
    """A transient Ray error on a poll fails the stage it carried; a stage delivered
    earlier keeps waiting and its answer comes with the next poll."""
    ex = executor()
    released = asyncio.Event()

    async def stage(call: StageCall) -> StageOutcome:
        if call.spec.id == "r1":
            await released.wait()
        return StageOutcome()

    fake = FakeActor(run_stage=stage)
    exchange = fake.replies["exchange"]
    failed: list[int] = []

    async def fails_the_poll_with_r0s_run(payload: bytes | None, ack: int, wait: float) -> Any:
        stages = [item.call.stage for item in pickle.loads(payload) if item.call] if payload is not None else []
        if "run" in stages and not failed:
            failed.append(ack)
            raise RaySystemError("a transient failure")
        return await exchange(payload, ack, wait)

    fake.replies["exchange"] = fails_the_poll_with_r0s_run
    n = node(ex, "n", fake)
    r0, r1 = rollout("r0"), rollout("r1")
    ex._where[r0.id] = ex._where[r1.id] = n
    waiting = asyncio.create_task(ex.run_stage(r1, handler=None, stage="init"))  # type: ignore[arg-type]
    await asyncio.wait_for(ex.run_stage(r0, handler=None, stage="init"), 10)  # type: ignore[arg-type]
    with pytest.raises(InfraError, match="RaySystemError"):
        await asyncio.wait_for(ex.run_stage(r0, handler=None, stage="run"), 10)  # type: ignore[arg-type]
    assert failed and not waiting.done()
    released.set()
    await asyncio.wait_for(waiting, 10)  # r1's answer, from a later poll
    assert n.alive and n.lost == 0
    await ex._link(n).aclose()


async def test_polls_that_keep_failing_fail_every_request_waiting(killed, monkeypatch):
    """A node whose polls fail again and again (not a dead worker) cannot answer: after
    MAX_FAILED_POLLS in a row, every request waiting there fails, none hangs."""
    monkeypatch.setattr(link_module, "FAILED_POLL_S", 0.01)
    ex = executor()
    fake = FakeActor(run_stage=lambda call: asyncio.Event().wait())  # never answered
    exchange = fake.replies["exchange"]
    polls: list[float] = []

    async def delivers_then_fails(payload: bytes | None, ack: int, wait: float) -> Any:
        if payload is None:
            polls.append(wait)
            raise RaySystemError("the node cannot be polled")
        return await exchange(payload, ack, 0.0)  # delivered, nothing ready

    fake.replies["exchange"] = delivers_then_fails
    n = node(ex, "n", fake)
    r = rollout("r1")
    ex._where[r.id] = n
    with pytest.raises(InfraError, match="cannot be polled"):
        await asyncio.wait_for(ex.run_stage(r, handler=None, stage="init"), 10)  # type: ignore[arg-type]
    assert len(polls) == link_module.MAX_FAILED_POLLS and all(wait > 0 for wait in polls)
    await ex._link(n).aclose()

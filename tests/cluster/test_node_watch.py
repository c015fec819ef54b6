"""The head's watch over its node workers, with fake worker actors: backends added or
removed while a worker starts reach it before it takes rollouts; a stage call that
finds its worker unavailable (``ActorUnavailableError``: maybe back soon) ends the
attempt as ``NodeLost`` without counting the node dead; a worker that leaves
``fence_after_polls`` status polls in a row unanswered is fenced (killed, the node
lost), one that answers in between is not."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402

from rollserve.cluster import executor as executor_module  # noqa: E402
from rollserve.cluster.protocol import WorkerReport  # noqa: E402
from rollserve.errors import NodeLost  # noqa: E402
from tests.cluster.test_executor_control import (  # noqa: E402
    INFO,
    FakeActor,
    FakeWorkerClass,
    answer,
    executor,
    fails,
    node,
    report,
    rollout,
    scan,
)


async def test_backends_changed_while_a_worker_starts_reach_it_before_it_joins(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    ex.settings.backends = ["http://a:8000"]
    joined_when: list[int] = []

    async def slow_start(*args: Any) -> dict[str, Any]:
        # The trainer changes the head's backends while this node's worker starts.
        ex.backend_added("b", "http://b:8000", 2.0)
        await ex.backend_removed("a", 0.0)
        return await report()

    async def remember(*args: Any) -> None:
        joined_when.append(len(ex.placement.nodes))  # 0: before it takes rollouts

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(
        lambda s: made.append(FakeActor(s, start=slow_start, add_backend=remember, remove_backend=remember)) or made[-1]
    )
    await scan(ex)
    (actor,) = made
    assert actor.settings["added_backends"] == [] and actor.settings["removed_backends"] == []
    assert actor.calls["remove_backend"] == [("a", 0.0)]
    assert actor.calls["add_backend"] == [("http://b:8000", 2.0)]
    assert joined_when == [0, 0]
    (joined,) = ex.placement.nodes.values()
    assert joined.actor is actor and joined.alive


async def test_a_worker_started_with_no_change_meanwhile_is_sent_nothing(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    ex.backend_added("b", "http://b:8000", 1.0)  # before: in its settings
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=report)) or made[-1])
    await scan(ex)
    (actor,) = made
    assert actor.settings["added_backends"] == [["http://b:8000", 1.0]]
    assert "add_backend" not in actor.calls and "remove_backend" not in actor.calls


async def test_an_unavailable_worker_ends_the_attempt_without_counting_the_node_dead(killed):
    ex = executor()
    n = node(ex, "n", FakeActor(run_stage=fails(ActorUnavailableError("connection lost", None))))
    r = rollout("r1")
    ex._where[r.id] = n
    with pytest.raises(NodeLost, match="node n was unreachable during run"):
        await ex.run_stage(r, handler=None, stage="run")  # type: ignore[arg-type]
    assert n.alive and n.lost == 1 and killed == []


async def test_a_dead_worker_still_counts_the_node_dead(killed):
    ex = executor()
    n = node(ex, "n", FakeActor(run_stage=fails(ActorDiedError())))
    r = rollout("r1")
    ex._where[r.id] = n
    with pytest.raises(NodeLost, match="node n died during run"):
        await ex.run_stage(r, handler=None, stage="run")  # type: ignore[arg-type]
    assert not n.alive


async def test_a_worker_that_never_answers_its_status_polls_is_fenced(killed):
    ex = executor()  # call_timeout 0.2 s; fence_after_polls 3
    good = node(ex, "good", FakeActor(status=report))
    silent = node(ex, "silent", FakeActor(status=answer(None, delay=30)))
    flaky = node(ex, "flaky", FakeActor(status=fails(ActorUnavailableError("gone", None))))
    for _ in range(2):
        await asyncio.wait_for(ex._poll_workers(), 10)
    assert silent.alive and flaky.alive and silent.unanswered == 2 and killed == []
    await asyncio.wait_for(ex._poll_workers(), 10)
    assert good.alive and good.unanswered == 0
    assert not silent.alive and not flaky.alive
    assert len(killed) == 2 and silent.actor in killed and flaky.actor in killed
    r = rollout("r1")
    ex._where[r.id] = silent
    with pytest.raises(NodeLost, match="node silent"):
        await ex.run_stage(r, handler=None, stage="eval")  # type: ignore[arg-type]


async def test_a_worker_that_answers_between_silences_is_not_fenced(killed):
    ex = executor()
    replies = iter([None, None, "ok", None, None, "ok"])

    async def sometimes(*args: Any) -> Any:
        if next(replies) is None:
            await asyncio.sleep(30)
        return WorkerReport(node="n", pid=1, hosted=0, running=0, sandboxes_open=2, reaped_at_start=0)

    n = node(ex, "n", FakeActor(status=sometimes))
    for _ in range(6):
        await asyncio.wait_for(ex._poll_workers(), 10)
    assert n.alive and n.unanswered == 0 and n.sandboxes_open == 2 and killed == []


async def test_ray_kill_runs_off_the_event_loop(monkeypatch):
    """``ray.kill`` waits for an actor still registering with the GCS (the calling
    thread held): the head's kill returns at once and the kill happens on the ray pool."""
    from rollserve.cluster import calls

    released = threading.Event()
    killed_in: list[tuple[Any, str]] = []

    def blocking_kill(actor: Any, no_restart: bool) -> None:
        released.wait(30)
        killed_in.append((actor, threading.current_thread().name))

    monkeypatch.setattr(calls.ray, "kill", blocking_kill)
    actor = object()
    calls.kill(actor)  # would hold the loop (and this test) 30 s if it ran here
    assert not released.is_set() and killed_in == []
    released.set()
    await calls.wait_killed(10)
    assert killed_in == [(actor, killed_in[0][1])] and killed_in[0][1].startswith("rollserve-ray")


async def test_a_look_at_the_nodes_waits_for_the_last_one_instead_of_piling_up(killed, monkeypatch):
    """``ray.nodes()`` stuck on a slow GCS: the scan gives up after call_timeout, and the
    next scans do not start another call until it returns (no thread piles up)."""
    released = threading.Event()
    asked: list[int] = []

    def slow_nodes() -> list[dict[str, Any]]:
        asked.append(1)
        released.wait(30)
        return [INFO]

    monkeypatch.setattr(executor_module.ray, "nodes", slow_nodes)
    ex = executor()
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=report)) or made[-1])
    with pytest.raises(TimeoutError):
        await ex._scan()
    await ex._scan()  # the first call still waits: not asked again
    await ex._scan()
    assert len(asked) == 1 and made == []
    released.set()
    await asyncio.wait_for(asyncio.shield(ex._listing), 10)  # type: ignore[arg-type]
    await scan(ex)
    assert len(asked) == 2 and len(made) == 1


async def test_unavailable_stage_calls_and_cleanups_count_as_missed_answers(killed):
    """A cleanup that finds the worker unreachable does not count the node dead (its
    rollouts would all be lost for a blip); stage calls that keep finding it so fence it,
    as unanswered status polls do (else its rollouts' retries keep landing there)."""
    ex = executor()  # fence_after_polls 3
    unavailable = fails(ActorUnavailableError("connection lost", None))
    n = node(ex, "n", FakeActor(run_stage=unavailable, cleanup=unavailable))
    r = rollout("r0")
    ex._where[r.id] = n
    ex._called.add(r.id)
    await asyncio.wait_for(ex.cleanup(r, handler=None), 10)  # type: ignore[arg-type]
    assert n.alive and n.unanswered == 1 and killed == []
    for i in (1, 2):
        r = rollout(f"r{i}")
        ex._where[r.id] = n
        with pytest.raises(NodeLost, match="unreachable"):
            await ex.run_stage(r, handler=None, stage="run")  # type: ignore[arg-type]
    assert not n.alive and killed == [n.actor]


async def test_a_worker_answering_exchanges_is_asked_its_status_only_every_few_seconds(killed):
    """A worker that answered an exchange within the last ``poll_s`` has shown it
    answers: no status call for it, but one once its last report is ``STATUS_EVERY_S``
    old; a worker whose exchanges stopped is polled (and fenced when silent) as before."""
    import time

    from rollserve.cluster.watch import STATUS_EVERY_S

    ex = executor()  # poll_s 1.0
    silent = answer(None, delay=30)  # a status call would not be answered (call_timeout 0.2 s)
    n = node(ex, "n", FakeActor(status=silent))
    n.reported_at = time.monotonic()
    for _ in range(5):  # more looks than fence_after_polls, each just after an answered exchange
        n.answered_at = time.monotonic()
        await asyncio.wait_for(ex._poll_workers(), 10)
    assert "status" not in n.actor.calls and n.alive and n.unanswered == 0
    n.answered_at, n.reported_at = time.monotonic(), time.monotonic() - STATUS_EVERY_S  # its report is old
    n.actor.replies["status"] = report
    before = time.monotonic()
    await asyncio.wait_for(ex._poll_workers(), 10)
    assert len(n.actor.calls["status"]) == 1 and n.reported_at >= before
    n.answered_at = time.monotonic() - 2 * ex.config.poll_s  # its exchanges stopped: asked at every look
    n.actor.replies["status"] = silent
    for _ in range(3):
        await asyncio.wait_for(ex._poll_workers(), 10)
    assert not n.alive and killed == [n.actor] and len(n.actor.calls["status"]) == 4

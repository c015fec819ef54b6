"""The head's control of its node workers, with fake worker actors (the real path is
tests/cluster/test_ray_cluster.py): a node that does not answer a pause or a resume is
fenced (its worker killed, the node lost: its rollouts run again elsewhere), a stage
call that returns from a fenced node is not used, a worker that fails to start is
killed and tried again later under a new name, and a new worker starts at the head's
policy version (resumed if the head resumed while it joined), and every worker's router
replica names the LoRA adapter the head loaded (a worker that does not confirm is
fenced; one that starts later, or while the load ran, names it too)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from ray.exceptions import RayError  # noqa: E402

from rollserve.cluster import calls  # noqa: E402
from rollserve.cluster import executor as executor_module  # noqa: E402
from rollserve.cluster.executor import RayExecutor  # noqa: E402
from rollserve.cluster.nodes import ClusterNode  # noqa: E402
from rollserve.cluster.protocol import (  # noqa: E402
    LinkItem,
    LinkReply,
    RayConfig,
    StageOutcome,
    WorkerReport,
    WorkerSettings,
)
from rollserve.contract import Timeouts  # noqa: E402
from rollserve.engine.rollout import Rollout, RolloutSpec  # noqa: E402
from rollserve.errors import NodeLost  # noqa: E402
from rollserve.llm.routing.weights import WeightUpdate  # noqa: E402
from tests.waiting import eventually

Reply = Callable[..., Coroutine[Any, Any, Any]]


class Method:
    def __init__(self, reply: Reply, calls: list[tuple[Any, ...]]) -> None:
        self.reply, self.calls = reply, calls

    def remote(self, *args: Any) -> Coroutine[Any, Any, Any]:
        self.calls.append(args)
        return self.reply(*args)


class FakeActor:
    """A node worker's handle: each method answers as the test sets it. The batches the
    head sends (``exchange``) are answered as the worker does, each request by
    the test's ``run_stage`` or ``cleanup``; one of those that raises a Ray error fails
    the next poll with it (as a worker that dies or cannot be reached fails every call)."""

    def __init__(self, settings_json: str = "{}", **replies: Reply) -> None:
        self.settings = json.loads(settings_json)
        self.calls: dict[str, list[tuple[Any, ...]]] = {}
        self.replies: dict[str, Reply] = {
            "pause": answer(True),
            "resume": answer(None),
            "cleanup": answer(None),
            "weights_loaded": answer(None),
            "exchange": self._exchange,
            **replies,
        }
        self.batches: list[list[LinkItem]] = []  # the requests each exchange carried
        self._answers: list[LinkReply] = []
        self._failures: list[BaseException] = []
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def _exchange(self, payload: bytes | None, ack: int, wait: float) -> list[LinkReply]:
        if payload is not None:
            items: list[LinkItem] = pickle.loads(payload)
            self.batches.append(items)
            for item in items:
                task = asyncio.create_task(self._answer(item))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if payload is not None and wait <= 0 and not self._failures:
            return []  # only delivering: the wait on its way takes the answers (as the worker does)
        if not self._failures and not [a for a in self._answers if a.seq > ack] and wait > 0:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), wait)
        if self._failures:
            raise self._failures.pop(0)
        return [a for a in self._answers if a.seq > ack]

    async def _answer(self, item: LinkItem) -> None:
        reply = LinkReply(seq=0, id=item.id)
        try:
            if item.call is not None:
                reply.outcome = await self.run_stage.remote(item.call)
                if item.call.release:  # as the worker does: cleaned up before the answer
                    await self.cleanup.remote(item.call.spec.id, item.call.attempt, False)
            else:
                assert item.cleanup is not None
                reply.outcome = await self.cleanup.remote(*item.cleanup)
        except RayError as exc:
            self._failures.append(exc)
            self._ready.set()
            return
        except Exception as exc:
            reply.error = f"{type(exc).__name__}: {exc}"
        reply.seq = len(self._answers) + 1
        self._answers.append(reply)
        self._ready.set()

    def __getattr__(self, method: str) -> Method:
        if method.startswith("_") or method not in self.replies:
            raise AttributeError(method)
        return Method(self.replies[method], self.calls.setdefault(method, []))


def answer(value: Any, delay: float = 0.0) -> Reply:
    async def reply(*args: Any) -> Any:
        await asyncio.sleep(delay)
        return value

    return reply


def fails(exc: BaseException) -> Reply:
    async def reply(*args: Any) -> Any:
        raise exc

    return reply


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The actors the executor kills (ray.kill takes only real handles)."""
    kills: list[Any] = []
    monkeypatch.setattr(calls, "kill", kills.append)
    return kills


def executor(version: list[int | None] | None = None) -> RayExecutor:
    config = RayConfig(address="auto", call_timeout=0.2, worker_start_timeout=0.5)
    settings = WorkerSettings(node="", state_dir=Path("/nonexistent"), tokenizer="fake")
    box = version if version is not None else [None]
    return RayExecutor(config, settings, policy_version=lambda: box[0])


def node(ex: RayExecutor, name: str, actor: FakeActor) -> ClusterNode:
    n = ClusterNode(name=name, node_id=f"id-{name}", slots=4, actor=actor)
    ex.placement.add(n)
    return n


def rollout(rid: str) -> Rollout:
    spec = RolloutSpec(id=rid, group_id="g", task_id="t", sample_index=0, data_source="math", instance={}, sampling={})
    return Rollout(spec=spec, attempt=1, max_turns=1, max_context_tokens=100, timeouts=Timeouts())


async def test_a_node_that_does_not_answer_a_pause_is_fenced_and_its_rollouts_are_lost(killed):
    ex = executor()
    good = node(ex, "good", FakeActor())
    slow = node(ex, "slow", FakeActor(pause=answer(True, delay=30)))
    odd = node(ex, "odd", FakeActor(pause=fails(RuntimeError("unreachable"))))
    assert await asyncio.wait_for(ex.pause("finish", 0.1), 10) is True
    assert good.alive and not slow.alive and not odd.alive
    assert killed == [slow.actor, odd.actor]
    r = rollout("r1")
    ex._where[r.id] = slow
    with pytest.raises(NodeLost, match="node slow"):
        await ex.run_stage(r, handler=None, stage="run")  # type: ignore[arg-type]


async def test_a_node_still_draining_at_the_pause_leaves_it_undrained(killed):
    ex = executor()
    node(ex, "busy", FakeActor(pause=answer(False)))
    assert await ex.pause("finish", 0.1) is False
    assert killed == []


async def test_a_node_that_does_not_answer_a_resume_is_fenced(killed):
    ex = executor()
    good = node(ex, "good", FakeActor())
    stuck = node(ex, "stuck", FakeActor(resume=answer(None, delay=30)))
    await asyncio.wait_for(ex.resume(3), 10)
    assert good.alive and not stuck.alive and killed == [stuck.actor]
    assert good.actor.calls["resume"] == [(3,)]


async def test_a_stage_that_returns_from_a_node_fenced_meanwhile_is_not_used(killed):
    ex = executor()
    released = asyncio.Event()

    async def stage(*args: Any) -> StageOutcome:
        await released.wait()
        return StageOutcome(reward=1.0)

    n = node(ex, "n", FakeActor(run_stage=stage, pause=answer(True, delay=30)))
    r = rollout("r1")
    ex._where[r.id] = n
    running = asyncio.create_task(ex.run_stage(r, handler=None, stage="eval"))  # type: ignore[arg-type]
    await eventually(lambda: n.actor.calls.get("run_stage"), what="the stage to reach the node")
    await asyncio.wait_for(ex.pause("finish", 0.1), 10)
    released.set()
    with pytest.raises(NodeLost):
        await asyncio.wait_for(running, 10)
    assert r.reward is None


class FakeWorkerClass:
    """``ray.remote(NodeWorker)``: the actors it made, by name."""

    def __init__(self, make: Callable[[str], FakeActor]) -> None:
        self.make = make
        self.made: dict[str, FakeActor] = {}

    def options(self, name: str, **options: Any) -> Any:
        cls = self

        class Remote:
            @staticmethod
            def remote(settings_json: str) -> FakeActor:
                if name in cls.made:
                    raise ValueError(f"The name {name} is already taken")
                actor = cls.make(settings_json)
                cls.made[name] = actor
                return actor

        return Remote()


def report(*args: Any) -> Coroutine[Any, Any, dict[str, Any]]:
    return answer(WorkerReport(node="n", pid=1, hosted=0, running=0, sandboxes_open=0, reaped_at_start=0))()


INFO = {"NodeID": "ab" * 28, "Alive": True, "NodeManagerHostname": "host-a", "Resources": {"rollserve": 4.0}}


def healthy_workers(ex: RayExecutor) -> list[FakeActor]:
    """Workers that start at once; the list of those made, in order."""
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=report)) or made[-1])
    return made


async def scan(ex: RayExecutor) -> None:
    """One look at the nodes, and the worker starts it began."""
    await ex._scan()
    await ex.wait_started(5)


async def test_a_worker_that_fails_to_start_is_killed_and_tried_again_later_under_a_new_name(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    clock = [1000.0]
    monkeypatch.setattr(executor_module.time, "monotonic", lambda: clock[0])
    ex = executor()
    attempts: list[FakeActor] = []

    def make(settings_json: str) -> FakeActor:
        ok = len(attempts) >= 2
        actor = FakeActor(settings_json, start=report if ok else fails(RuntimeError("no tokenizer")))
        attempts.append(actor)
        return actor

    ex._worker_class = FakeWorkerClass(make)
    await scan(ex)
    assert killed == [attempts[0]] and not ex.placement.nodes
    await ex._scan()  # within the backoff (1 s): not tried again yet
    assert len(attempts) == 1 and not ex._starting
    clock[0] += 1.5
    await scan(ex)
    assert killed == attempts[:2] and ex._retry[INFO["NodeID"]] == (1003.5, 4.0)  # doubled
    clock[0] += 2.5
    await scan(ex)
    assert len(attempts) == 3 and len(set(ex._worker_class.made)) == 3
    (joined,) = ex.placement.nodes.values()
    assert joined.actor is attempts[2] and joined.alive


async def test_a_worker_whose_start_is_cancelled_is_killed(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=answer(None, delay=30))) or made[-1])
    await ex._scan()
    await eventually(lambda: made and made[0].calls.get("start"), what="the worker's start")
    for task in list(ex._starting.values()):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert killed == made and len(made) == 1


async def test_a_new_worker_starts_at_the_heads_version_and_resumes_if_the_head_did(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    version: list[int | None] = [4]
    ex = executor(version)
    await ex.pause("finish", 1)  # no node yet

    resumed: list[asyncio.Task[None]] = []

    async def paused_until_resumed(*args: Any) -> bool:
        # The head resumes (at version 5) while this node's join-time pause runs.
        version[0] = 5
        resumed.append(asyncio.create_task(ex.resume(5)))
        for _ in range(3):  # it runs until it waits (for the control plane's lock)
            await asyncio.sleep(0)
        return True

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(
        lambda s: made.append(FakeActor(s, start=report, pause=paused_until_resumed)) or made[-1]
    )
    await scan(ex)
    await asyncio.wait_for(resumed[0], 10)
    (actor,) = made
    assert actor.settings["policy_version"] == 4
    assert actor.calls["pause"] == [("finish", None)] and actor.calls["resume"] == [(5,)]
    assert killed == []


async def test_a_node_named_like_another_alive_node_gets_no_worker(killed, monkeypatch):
    """A name is the node's owner-record folder: a second node with the same name (a
    copied --labels rollserve-node=X) would reap the first one's live sandboxes as a
    dead predecessor's. It gets no worker while the other is alive; once it has the name
    to itself, it does."""
    twin = {**INFO, "NodeID": "cd" * 28}  # same host name, another node
    nodes = [INFO]
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: list(nodes))
    ex = executor()
    made = healthy_workers(ex)
    await scan(ex)
    assert [n.node_id for n in ex.placement.nodes.values()] == [INFO["NodeID"]]
    nodes.append(twin)  # joins under the same name
    await scan(ex)
    assert len(made) == 1 and twin["NodeID"] not in {n.node_id for n in ex.placement.nodes.values()}
    nodes[:] = [{**INFO, "Alive": False}, twin]  # the first one leaves
    await scan(ex)
    assert len(made) == 2 and ex.placement.current(twin["NodeID"]) is not None
    assert not killed


async def test_a_drain_outlives_the_nodes_worker(killed, monkeypatch):
    """A node drained for maintenance stays drained when its worker is replaced (its
    raylet lives on, the worker died), until it is undrained."""
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()
    made = healthy_workers(ex)
    await scan(ex)
    (first,) = await ex.drain("host-a", True)
    assert first.draining
    ex._mark_dead(ex.placement.current(INFO["NodeID"]), "its worker died")
    await scan(ex)
    replaced = ex.placement.current(INFO["NodeID"])
    assert len(made) == 2 and replaced is not None and replaced.actor is made[1]
    assert replaced.alive and replaced.draining
    (again,) = [n for n in await ex.drain("host-a", False) if n.alive]
    assert not again.draining


LORA = WeightUpdate(kind="lora", name="policy-7", path="/ckpt")


async def test_every_node_names_the_adapter_the_head_loaded_or_is_fenced(killed, monkeypatch):
    ex = executor()
    good = node(ex, "good", FakeActor())
    slow = node(ex, "slow", FakeActor(weights_loaded=answer(None, delay=30)))
    odd = node(ex, "odd", FakeActor(weights_loaded=fails(RuntimeError("cannot serve it"))))
    await asyncio.wait_for(ex.weights_loaded(LORA, ["b"]), 10)
    assert good.actor.calls["weights_loaded"] == [("policy-7", ["b"])]
    assert good.alive and not slow.alive and not odd.alive
    assert killed == [slow.actor, odd.actor]  # they might sample the base model under v7
    # A worker that starts later is told in its settings.
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    made = healthy_workers(ex)
    await scan(ex)
    (late,) = made
    assert late.settings["lora"] == "policy-7" and "weights_loaded" not in late.calls
    # Full weights: the base model's name again, everywhere.
    await ex.weights_loaded(WeightUpdate(kind="full", path="/ckpt-full"), [])
    assert late.calls["weights_loaded"] == [(None, [])]


async def test_a_worker_that_started_while_a_load_ran_names_the_adapter(killed, monkeypatch):
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    ex = executor()

    async def start_during_a_load(*args: Any) -> Any:
        await ex.weights_loaded(LORA, [])  # no node in placement yet: it is not told
        return await report()

    made: list[FakeActor] = []
    ex._worker_class = FakeWorkerClass(lambda s: made.append(FakeActor(s, start=start_during_a_load)) or made[-1])
    await scan(ex)
    (actor,) = made
    assert actor.settings["lora"] is None
    assert actor.calls["weights_loaded"] == [("policy-7", [])]
    assert ex.placement.current(INFO["NodeID"]) is not None and killed == []


async def test_once_stopped_the_heads_router_stopping_after_it_reaches_no_worker(killed, monkeypatch):
    """Service.stop stops the executor (workers killed, Ray shut down) before its router,
    whose backends are then removed: nothing may be sent to a worker any more (a call
    after Ray's shutdown raises at once, and failed the server's shutdown)."""
    ex = executor()
    actor = FakeActor(stop=answer(None), remove_backend=answer(None))
    node(ex, "a", actor)
    monkeypatch.setattr(executor_module.ray, "shutdown", lambda: None)
    await asyncio.wait_for(ex.stop(), 10)
    assert killed == [actor]
    await asyncio.wait_for(ex.backend_removed("b", 0.0), 10)
    await asyncio.wait_for(ex.resume(3), 10)
    assert "remove_backend" not in actor.calls and "resume" not in actor.calls

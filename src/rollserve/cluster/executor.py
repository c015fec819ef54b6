"""The head's side of the cluster: ``RayExecutor`` runs each stage in the worker
actor of the node its rollout was placed on, watches the cluster's nodes (a worker
starts on each alive node that offers the ``rollserve`` resource, including nodes
that join later) and turns a dead node into ``NodeLost`` (the engine retries the
rollout elsewhere or masks it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollserve.cluster.nodes import ClusterNode, Placement
from rollserve.cluster.protocol import RayConfig, StageCall, StageOutcome, WorkerReport, WorkerSettings
from rollserve.cluster.worker import NodeWorker
from rollserve.contract import NodeStatus, Stage
from rollserve.engine.executor import CLEANUP_TIMEOUT
from rollserve.engine.rollout import Rollout
from rollserve.errors import InfraError, NodeLost
from rollserve.handlers.base import AgentHandler
from rollserve.llm.base import PauseMode
from rollserve.llm.routing.deadline import current_deadline

log = logging.getLogger(__name__)

NAMESPACE = "rollserve"
NODE_LABEL = "rollserve-node"  # a node's name, where set (else its host name)
# A node whose worker failed to start is tried again after this, doubling per failure.
START_BACKOFF = 1.0
START_BACKOFF_MAX = 60.0


def node_name(info: dict[str, Any]) -> str:
    """A node's name: its ``rollserve-node`` label, else its host name (one raylet per
    machine); it names the node's owner-record folder, so it must outlive a restart (and
    is kept to letters, digits, '.', '_' and '-': a folder name, never a path)."""
    labels = info.get("Labels") or {}
    name = str(labels.get(NODE_LABEL) or info.get("NodeManagerHostname") or info["NodeID"])
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or str(info["NodeID"])


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except (RayError, ValueError):
        pass  # already gone


def _cancel(ref: Any) -> None:
    """Cancel a stage call (its task on the worker; one still queued there may run
    anyway: the worker refuses stages of an attempt it cleaned up)."""
    try:
        ray.cancel(ref)
    except (RayError, ValueError, TypeError):
        pass  # done already


class RayExecutor:
    """Stages run in the node workers of a Ray cluster (``engine.executor``)."""

    def __init__(self, config: RayConfig, settings: WorkerSettings,
                 policy_version: Callable[[], int | None] | None = None) -> None:
        self.config = config
        self.settings = settings
        # The head router's current policy version, read at each call (a callable).
        self._policy_version = policy_version
        self.placement = Placement()
        self._where: dict[str, ClusterNode] = {}  # rollout id -> its node
        self._synced: set[str] = set()  # rollouts whose last stage call returned
        self._called: set[str] = set()  # rollouts whose attempt sent its node a stage call
        self._starting: dict[str, asyncio.Task[None]] = {}  # node id -> its worker's start
        # node id -> (when its worker may be started again, the backoff after that)
        self._retry: dict[str, tuple[float, float]] = {}
        self._clashes: set[str] = set()  # nodes refused a worker: another has their name
        self._drained: set[str] = set()  # node names drained (their next workers too)
        self._starts = itertools.count(1)  # each start's actor has its own name
        self._watcher: asyncio.Task[None] | None = None
        self._worker_class: Any = ray.remote(NodeWorker)
        self._paused: PauseMode | None = None  # the head's router is paused (its mode)
        self._added: dict[str, tuple[str, float]] = {}  # backends the head got at run time
        self._removed: set[str] = set()  # backend names the head removed at run time
        self._background: set[asyncio.Task[None]] = set()
        # Told the alive nodes' slots, all together, whenever they change (the server
        # sizes the head's stage pools by them).
        self.on_slots: Callable[[int], None] | None = None
        self._slots = 0

    # --- life cycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Join the cluster and start a worker on every node that offers the resource
        now (bounded); then keep watching for nodes that join or leave."""
        await asyncio.to_thread(ray.init, address=self.config.address, namespace=NAMESPACE,
                                log_to_driver=False, ignore_reinit_error=True)
        await self._scan()
        await self.wait_started(self.config.worker_start_timeout)
        if not any(n.alive for n in self.placement.nodes.values()):
            log.warning("no node offers the %r resource yet: rollouts wait (bounded by their "
                        "total timeout) until one joins", self.config.resource)
        self._watcher = asyncio.create_task(self._watch(), name="rollserve-ray-nodes")

    async def stop(self) -> None:
        tasks = [t for t in (self._watcher, *self._starting.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        alive = [n for n in self.placement.nodes.values() if n.alive]
        stops = [self._bounded(n.actor.stop.remote(), self.config.call_timeout * 3) for n in alive]
        await asyncio.gather(*stops, return_exceptions=True)
        for node in alive:
            _kill(node.actor)
        await asyncio.to_thread(ray.shutdown)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            try:
                await self._scan()
                await self._poll_workers()
            except Exception:
                log.exception("watching the cluster's nodes failed; trying again")

    async def _scan(self) -> None:
        """Mark the workers of nodes gone as dead; start a worker (in the background,
        bounded) on each alive node that offers the resource and has no live worker:
        a node new to us, or one whose worker died while its raylet lives on."""
        infos: list[dict[str, Any]] = await asyncio.wait_for(asyncio.to_thread(ray.nodes),
                                                             self.config.call_timeout)
        alive_ids = {i["NodeID"] for i in infos if i.get("Alive")}
        for node in self.placement.nodes.values():
            if node.alive and node.node_id not in alive_ids:
                self._mark_dead(node, "its raylet is gone")
        offering = [i for i in infos if i.get("Alive")
                    and float((i.get("Resources") or {}).get(self.config.resource, 0)) >= 1]
        by_name: dict[str, set[str]] = {}
        for info in offering:
            by_name.setdefault(node_name(info), set()).add(str(info["NodeID"]))
        for info in offering:
            node_id = str(info["NodeID"])
            if (node_id in self._starting
                    or time.monotonic() < self._retry.get(node_id, (0.0, 0.0))[0]):
                continue
            current = self.placement.current(node_id)
            if current is not None and current.alive:
                continue
            if self._name_taken(info, by_name):
                continue
            if current is not None:
                _kill(current.actor)  # gone or unreachable: it must not run on beside the new one
            generation = 1 if current is None else current.generation + 1
            self._starting[node_id] = asyncio.create_task(
                self._start_worker(info, generation), name=f"rollserve-worker-{node_id[:12]}")

    def _name_taken(self, info: dict[str, Any], by_name: dict[str, set[str]]) -> bool:
        """Another alive node has this node's name: it gets no worker. A name is the
        node's owner-record folder (``<state_dir>/nodes/<name>``, often on a shared file
        system): a worker starting there would take the other node's live sandboxes
        for a dead predecessor's and reap them."""
        node_id, name = str(info["NodeID"]), node_name(info)
        others = by_name.get(name, set()) - {node_id}
        if not others:
            self._clashes.discard(node_id)
            return False
        if node_id not in self._clashes:
            self._clashes.add(node_id)
            log.error("node %s (%s) gets no worker: node(s) %s have the same name; give each "
                      "node its own '%s' label", name, node_id[:12],
                      ", ".join(sorted(o[:12] for o in others)), NODE_LABEL)
        return True

    async def _start_worker(self, info: dict[str, Any], generation: int) -> None:
        node_id, name = str(info["NodeID"]), node_name(info)
        slots = int(float(info["Resources"][self.config.resource]))
        settings = self.settings.model_copy(update={
            "node": name, "removed_backends": sorted(self._removed),
            "added_backends": list(self._added.values()),
            "policy_version": self._current_version()})
        actor: Any = None
        try:
            actor = self._worker_class.options(
                name=f"rollserve-worker-{node_id[:16]}-{generation}-{next(self._starts)}",
                num_cpus=0, max_restarts=0, max_concurrency=max(1000, slots * 8),
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(settings.model_dump_json())
            report = WorkerReport.model_validate(await self._bounded(
                actor.start.remote(), self.config.worker_start_timeout))
            if self._paused is not None:  # joined while the head is paused: paused too
                await self._bounded(actor.pause.remote(self._paused, None), self.config.call_timeout)
                if self._paused is None:  # the head resumed meanwhile: so does this node
                    await self._bounded(actor.resume.remote(self._current_version()),
                                        self.config.call_timeout)
        except BaseException as exc:  # every failure, a cancel too: no actor is left running
            if actor is not None:
                _kill(actor)
            if not isinstance(exc, Exception):
                raise
            backoff = self._retry.get(node_id, (0.0, START_BACKOFF))[1]
            self._retry[node_id] = (time.monotonic() + backoff, min(START_BACKOFF_MAX, backoff * 2))
            log.error("node %s (%s): its worker did not start (tried again in %.0f s): %s: %s",
                      name, node_id[:12], backoff, type(exc).__name__, exc)
            return
        finally:
            self._starting.pop(node_id, None)
        self._retry.pop(node_id, None)
        node = ClusterNode(name=name, node_id=node_id, slots=slots, actor=actor,
                           generation=generation, reaped_at_start=report.reaped_at_start,
                           draining=name in self._drained)  # a drain outlives its worker
        self.placement.add(node)
        self._slots_changed()
        log.info("node %s (%s) joined: %d slots, worker pid %d, %d sandboxes reaped", name,
                 node_id[:12], slots, report.pid, report.reaped_at_start)
        await self.placement.changed()

    async def wait_started(self, timeout: float) -> None:
        """Wait (bounded) for the workers starting now."""
        starting = list(self._starting.values())
        if starting:
            await asyncio.wait(starting, timeout=timeout)

    async def _poll_workers(self) -> None:
        async def one(node: ClusterNode) -> None:
            try:
                report = WorkerReport.model_validate(
                    await self._bounded(node.actor.status.remote(), self.config.call_timeout))
                node.sandboxes_open = report.sandboxes_open
            except RayActorError as exc:
                self._mark_dead(node, f"its worker died ({type(exc).__name__})")
            except (RayError, TimeoutError):
                pass  # slow to answer: the stage calls' own deadlines bound the rest

        await asyncio.gather(*(one(n) for n in self.placement.nodes.values() if n.alive))

    def _current_version(self) -> int | None:
        return self._policy_version() if self._policy_version is not None else None

    def _fence(self, node: ClusterNode, why: str) -> None:
        """A node whose worker did not answer a pause or resume may sample on under the
        wrong policy: kill its worker and count it lost (its rollouts run again elsewhere)."""
        _kill(node.actor)
        self._mark_dead(node, why)

    def _mark_dead(self, node: ClusterNode, why: str) -> None:
        if node.alive:
            log.warning("node %s (%s) lost: %s; its %d rollouts end their attempt", node.name,
                        node.node_id[:12], why, len(node.hosted))
        node.alive = False
        node.sandboxes_open = 0
        self._slots_changed()

    def _slots_changed(self) -> None:
        slots = sum(n.slots for n in self.placement.nodes.values() if n.alive)
        if slots != self._slots:
            self._slots = slots
            if self.on_slots is not None and slots > 0:
                self.on_slots(slots)

    @staticmethod
    async def _bounded(ref: Any, timeout: float) -> Any:
        return await asyncio.wait_for(ref, timeout)

    # --- the routers' control plane (a ``llm.routing.base.Follower`` of the head's) ---
    async def pause(self, mode: PauseMode, timeout: float | None) -> bool:
        """Pause every worker's router replica (each drains its own calls when ``mode``
        is ``finish``); a worker that started later is paused as it joins."""
        self._paused = mode
        alive = [n for n in self.placement.nodes.values() if n.alive]
        # A node drains within ``wait`` (bounded even when the head's own wait is not);
        # one that does not answer within ``wait`` and the call's bound is fenced.
        wait = self.config.call_timeout if timeout is None else timeout
        bound = self.config.call_timeout + wait
        replies = await asyncio.gather(
            *(self._bounded(n.actor.pause.remote(mode, wait), bound) for n in alive),
            return_exceptions=True)
        drained = True
        for node, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):  # fenced: a killed worker samples nothing
                self._fence(node, f"its worker did not pause ({type(reply).__name__}: {reply})")
            elif reply is not True:
                drained = False
        return drained

    async def resume(self, policy_version: int | None) -> None:
        self._paused = None
        alive = [n for n in self.placement.nodes.values() if n.alive]
        replies = await asyncio.gather(
            *(self._bounded(n.actor.resume.remote(policy_version), self.config.call_timeout)
              for n in alive), return_exceptions=True)
        for node, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):  # it may stamp an old version: fenced
                self._fence(node, f"its worker did not resume ({type(reply).__name__}: {reply})")

    def backend_added(self, name: str, source: str, weight: float) -> None:
        """The head's router got a backend: every worker adds it (in the background,
        bounded); workers that start later are given it."""
        self._added[name] = (source, weight)
        self._broadcast("add_backend", source, weight)

    async def backend_removed(self, name: str, grace: float) -> None:
        self._removed.add(name)
        self._added.pop(name, None)
        alive = [n for n in self.placement.nodes.values() if n.alive]
        replies = await asyncio.gather(
            *(self._bounded(n.actor.remove_backend.remote(name, grace),
                            grace + self.config.call_timeout) for n in alive),
            return_exceptions=True)
        for node, reply in zip(alive, replies):
            if isinstance(reply, BaseException):
                log.warning("removing backend %s on node %s failed: %s", name, node.name, reply)

    def _broadcast(self, method: str, *args: Any) -> None:
        async def one(node: ClusterNode) -> None:
            try:
                await self._bounded(getattr(node.actor, method).remote(*args),
                                    self.config.call_timeout)
            except (RayError, TimeoutError) as exc:
                log.warning("%s on node %s failed: %s", method, node.name, exc)

        for node in self.placement.nodes.values():
            if node.alive:
                task = asyncio.create_task(one(node))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # --- draining -------------------------------------------------------------------
    async def drain(self, name: str, draining: bool) -> list[NodeStatus]:
        """Stop (or resume) placing new rollouts on the nodes named ``name``; theirs
        finish. Raises KeyError when no node has that name."""
        nodes = self.placement.by_name(name)
        if not nodes:
            raise KeyError(name)
        for node in nodes:
            node.draining = draining
        (self._drained.add if draining else self._drained.discard)(name)
        await self.placement.changed()
        return [n.snapshot(self.placement.waiting) for n in nodes]

    # --- stages ---------------------------------------------------------------------
    async def reserve(self, r: Rollout) -> None:
        """Place the attempt on a node, once one has a free slot (``timing.queued_node``);
        the pipeline bounds the wait by the rollout's deadline, and ``cleanup`` frees
        the slot (a cancel while waiting takes none)."""
        if r.id in self._where:
            return
        waited = time.perf_counter()
        self._where[r.id] = await self.placement.place(r.id)
        r.add_time("queued_node", time.perf_counter() - waited)

    async def run_stage(self, r: Rollout, handler: AgentHandler, stage: Stage) -> None:
        if r.id not in self._where:  # the pipeline reserves first; a direct caller waits here
            await self.reserve(r)
        node = self._where[r.id]
        if not node.alive:
            node.lost += 1
            raise NodeLost(f"node {node.name} died before {stage} (attempt {r.attempt})", node.name)
        self._synced.discard(r.id)
        self._called.add(r.id)
        ref = node.actor.run_stage.remote(self._call(r, stage))
        node.busy[stage] += 1
        try:
            outcome: StageOutcome = await ref
        except asyncio.CancelledError:
            _cancel(ref)
            raise
        except RayActorError as exc:
            self._mark_dead(node, f"its worker died ({type(exc).__name__})")
            node.lost += 1
            raise NodeLost(f"node {node.name} died during {stage} (attempt {r.attempt}): "
                           f"{type(exc).__name__}", node.name) from None
        except RayError as exc:
            raise InfraError(f"node {node.name}: {stage} call failed: {type(exc).__name__}: "
                             f"{str(exc)[:500]}") from None
        finally:
            node.busy[stage] -= 1
            node.done[stage] += 1
        if not node.alive:  # fenced while the call ran: what it made is not used
            node.lost += 1
            raise NodeLost(f"node {node.name} was lost during {stage} (attempt {r.attempt})",
                           node.name)
        self._synced.add(r.id)
        self._apply(r, outcome)
        if outcome.error is not None:
            outcome.error.raise_again()

    def _call(self, r: Rollout, stage: Stage) -> StageCall:
        now = asyncio.get_running_loop().time()
        calls_end = current_deadline()
        return StageCall(
            spec=r.spec, attempt=r.attempt, stage=stage, max_turns=r.max_turns,
            max_context_tokens=r.max_context_tokens, timeouts=r.timeouts,
            max_staleness=r.max_staleness, mask_stale=r.mask_stale,
            rollout_left=None if r.deadline is None else r.deadline - now,
            calls_left=None if calls_end is None else calls_end - now,
            run_left=None if r.run_deadline is None or stage != "run" else r.run_deadline - now)

    @staticmethod
    def _apply(r: Rollout, outcome: StageOutcome) -> None:
        if outcome.trajectory is not None:
            r.trajectory = outcome.trajectory
        r.reward, r.evaluation = outcome.reward, outcome.evaluation
        r.stats = dict(outcome.stats)
        for key, seconds in outcome.timing.items():
            r.timing[key] = seconds  # the handler's own keys; the head keeps its stage times

    async def cleanup(self, r: Rollout, handler: AgentHandler) -> None:
        """Release the rollout's slot; its worker ends what still runs and closes its
        sandboxes (bounded). When its last stage call did not return (cut by a deadline
        or a cancel), what the worker had by then is copied back."""
        node = self._where.pop(r.id, None)
        synced = r.id in self._synced
        self._synced.discard(r.id)
        called = r.id in self._called
        self._called.discard(r.id)
        if node is None:
            return
        try:
            if node.alive and called:  # reserved only: the worker never heard of it
                outcome: StageOutcome | None = await asyncio.shield(self._bounded(
                    node.actor.cleanup.remote(r.id, r.attempt, not synced), CLEANUP_TIMEOUT))
                if outcome is not None and not synced and node.alive:
                    self._apply(r, outcome)
        except RayActorError as exc:
            self._mark_dead(node, f"its worker died ({type(exc).__name__})")
        except (RayError, TimeoutError) as exc:
            log.error("cleanup of rollout %s on node %s failed: %s", r.id, node.name, exc)
        finally:
            node.hosted.discard(r.id)
            await self.placement.changed()

    def nodes(self) -> list[NodeStatus] | None:
        return self.placement.statuses()

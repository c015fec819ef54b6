"""The head's watch over the cluster's nodes (``RayExecutor``'s base): a worker starts
on each alive node that offers the ``rollserve`` resource, including nodes that join
later, and is told the head's state as it joins (pause, policy version, the adapter
its backends name, backends added or removed meanwhile); each worker's status is
polled, and a node whose raylet is gone, whose worker died, or whose worker leaves
``fence_after_polls`` polls in a row unanswered is lost (a silent worker is killed
first: fenced).

A join converges with the control plane atomically: the head's pause, resume and
weight-load broadcasts (``RayExecutor``) and a join's catch-up take one lock
(``_control``), and the catch-up places the node before it lets go, with no await
between its last look at the head's state and the placement, so a broadcast either
came before the catch-up (which then applied its outcome) or reaches the node. The
worker's own start (reaping, its stack) runs outside the lock.
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
from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollserve.cluster import calls
from rollserve.cluster.nodes import ClusterNode, Placement
from rollserve.cluster.protocol import RayConfig, WorkerReport, WorkerSettings
from rollserve.cluster.worker import NodeWorker
from rollserve.llm.base import PauseMode

log = logging.getLogger(__name__)

NODE_LABEL = "rollserve-node"  # a node's name, where set (else its host name)
# A node whose worker failed to start is tried again after this, doubling per failure.
START_BACKOFF = 1.0
START_BACKOFF_MAX = 60.0
# A worker busy answering exchanges is asked for its status this often (else every poll_s).
STATUS_EVERY_S = 5.0


def node_name(info: dict[str, Any]) -> str:
    """A node's name: its ``rollserve-node`` label, else its host name (one raylet per
    machine); it names the node's owner-record folder, so it must outlive a restart (and
    is kept to letters, digits, '.', '_' and '-': a folder name, never a path)."""
    labels = info.get("Labels") or {}
    name = str(labels.get(NODE_LABEL) or info.get("NodeManagerHostname") or info["NodeID"])
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or str(info["NodeID"])


class NodeWatch:
    """Nodes and their workers, as the head sees them."""

    def __init__(
        self, config: RayConfig, settings: WorkerSettings, policy_version: Callable[[], int | None] | None = None
    ) -> None:
        self.config = config
        self.settings = settings
        # The head router's current policy version, read at each call (a callable).
        self._policy_version = policy_version
        self.placement = Placement()
        self._starting: dict[str, asyncio.Task[None]] = {}  # node id -> its worker's start
        # node id -> (when its worker may be started again, the backoff after that)
        self._retry: dict[str, tuple[float, float]] = {}
        self._clashes: set[str] = set()  # nodes refused a worker: another has their name
        self._drained: set[str] = set()  # node names drained (their next workers too)
        self._starts = itertools.count(1)  # each start's actor has its own name
        self._watcher: asyncio.Task[None] | None = None
        self._listing: asyncio.Future[list[dict[str, Any]]] | None = None  # ray.nodes() now
        self._worker_class: Any = ray.remote(NodeWorker)
        self._paused: PauseMode | None = None  # the head's router is paused (its mode)
        # The LoRA adapter the head loaded last (None: base; restored at a restart).
        self._lora: str | None = settings.lora
        self._lora_failed: list[str] = list(settings.lora_failed)  # whose load of it failed
        # Taken by the head's pause, resume and weight-load broadcasts and by a join's
        # catch-up (never by a worker's start, never while calling the head's router).
        self._control = asyncio.Lock()
        self._added: dict[str, tuple[str, float]] = {}  # backends the head got at run time
        self._removed: set[str] = set()  # backend names the head removed at run time
        self._backend_changes = 0  # how many times _added / _removed changed
        # Told the alive nodes' slots, all together, whenever they change (the server
        # sizes the head's stage pools by them).
        self.on_slots: Callable[[int], None] | None = None
        self._slots = 0

    def start_paused(self, mode: PauseMode) -> None:
        """The head's router starts paused (restored so): workers join paused, until the
        head resumes them."""
        self._paused = mode

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
        if self._listing is not None and not self._listing.done():
            log.warning("ray.nodes() has not answered since the last look; not asking again yet")
            return
        self._listing = asyncio.ensure_future(calls.nodes())
        # A failure after the wait below gave up is seen by no one: taken here (no
        # "exception never retrieved"); the next look asks again.
        self._listing.add_done_callback(lambda f: f.cancelled() or f.exception())
        infos = await asyncio.wait_for(asyncio.shield(self._listing), self.config.call_timeout)
        alive_ids = {i["NodeID"] for i in infos if i.get("Alive")}
        for node in self.placement.nodes.values():
            if node.alive and node.node_id not in alive_ids:
                self._mark_dead(node, "its raylet is gone")
        offering = [
            i for i in infos if i.get("Alive") and float((i.get("Resources") or {}).get(self.config.resource, 0)) >= 1
        ]
        by_name: dict[str, set[str]] = {}
        for info in offering:
            by_name.setdefault(node_name(info), set()).add(str(info["NodeID"]))
        for info in offering:
            node_id = str(info["NodeID"])
            if node_id in self._starting or time.monotonic() < self._retry.get(node_id, (0.0, 0.0))[0]:
                continue
            current = self.placement.current(node_id)
            if current is not None and current.alive:
                continue
            if self._name_taken(info, by_name):
                continue
            if current is not None:
                calls.kill(current.actor)  # gone or unreachable: it must not run on beside the new one
            generation = 1 if current is None else current.generation + 1
            self._starting[node_id] = asyncio.create_task(
                self._start_worker(info, generation), name=f"rollserve-worker-{node_id[:12]}"
            )

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
            log.error(
                "node %s (%s) gets no worker: node(s) %s have the same name; give each node its own '%s' label",
                name,
                node_id[:12],
                ", ".join(sorted(o[:12] for o in others)),
                NODE_LABEL,
            )
        return True

    async def _start_worker(self, info: dict[str, Any], generation: int) -> None:
        node_id, name = str(info["NodeID"]), node_name(info)
        slots = int(float(info["Resources"][self.config.resource]))
        changes = self._backend_changes
        settings = self.settings.model_copy(
            update={
                "node": name,
                "removed_backends": sorted(self._removed),
                "added_backends": list(self._added.values()),
                "policy_version": self._current_version(),
                "lora": self._lora,
                "lora_failed": list(self._lora_failed),
            }
        )
        actor: Any = None
        try:
            actor = self._worker_class.options(
                name=f"rollserve-worker-{node_id[:16]}-{generation}-{next(self._starts)}",
                num_cpus=0,
                max_restarts=0,
                max_concurrency=max(1000, slots * 8),
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(settings.model_dump_json())
            report = WorkerReport.model_validate(
                await self._bounded(actor.start.remote(), self.config.worker_start_timeout)
            )
            async with self._control:
                await self._catch_up(actor, settings, changes)
                # No await since the catch-up's last look: every broadcast from here on
                # (they wait for this lock) reaches the node.
                node = ClusterNode(
                    name=name,
                    node_id=node_id,
                    slots=slots,
                    actor=actor,
                    generation=generation,
                    reaped_at_start=report.reaped_at_start,
                    draining=name in self._drained,
                )  # a drain outlives its worker
                self.placement.add(node)
        except BaseException as exc:  # every failure, a cancel too: no actor is left running
            if actor is not None:
                calls.kill(actor)
            if not isinstance(exc, Exception):
                raise
            backoff = self._retry.get(node_id, (0.0, START_BACKOFF))[1]
            self._retry[node_id] = (time.monotonic() + backoff, min(START_BACKOFF_MAX, backoff * 2))
            log.error(
                "node %s (%s): its worker did not start (tried again in %.0f s): %s: %s",
                name,
                node_id[:12],
                backoff,
                type(exc).__name__,
                exc,
            )
            return
        finally:
            self._starting.pop(node_id, None)
        self._retry.pop(node_id, None)
        self._slots_changed()
        log.info(
            "node %s (%s) joined: %d slots, worker pid %d, %d sandboxes reaped",
            name,
            node_id[:12],
            slots,
            report.pid,
            report.reaped_at_start,
        )
        await self.placement.changed()

    async def _catch_up(self, actor: Any, settings: WorkerSettings, changes: int) -> None:
        """Bring a started worker (``settings``: what it started from; ``changes``: the
        backend-change count then) to the head's state now, under ``_control``: paused
        if the head is; its backends as the head's; naming the adapter the head's
        backends name (but for those whose load failed); resumed at the head's policy
        version if that moved while it started. Backend changes (not under the lock)
        are sent again until none came during the last call. Each call is bounded by
        ``call_timeout``; a failure is the start's (the worker is killed)."""
        paused = False
        named = (settings.lora, list(settings.lora_failed))
        version = settings.policy_version
        timeout = self.config.call_timeout
        while True:
            if self._paused is not None and not paused:  # joins while paused: paused too
                paused = True
                await self._bounded(actor.pause.remote(self._paused, None), timeout)
            elif changes != self._backend_changes:  # backends added or removed meanwhile
                changes = self._backend_changes
                await self._send_backends(actor)
            elif named != (self._lora, self._lora_failed):  # weights loaded as it started
                named = (self._lora, list(self._lora_failed))
                await self._bounded(actor.weights_loaded.remote(*named), timeout)
            elif self._paused is None and version != self._current_version():
                version = self._current_version()  # resumed at a new version as it started
                await self._bounded(actor.resume.remote(version), timeout)
            else:
                return

    async def _send_backends(self, actor: Any) -> None:
        """The head's backend changes since it started, as a new worker's settings
        carry them: removals, then additions (both idempotent on the worker)."""
        for name in sorted(self._removed):
            await self._bounded(actor.remove_backend.remote(name, 0.0), self.config.call_timeout)
        for source, weight in list(self._added.values()):
            await self._bounded(actor.add_backend.remote(source, weight), self.config.call_timeout)

    async def wait_started(self, timeout: float) -> None:
        """Wait (bounded) for the workers starting now."""
        starting = list(self._starting.values())
        if starting:
            await asyncio.wait(starting, timeout=timeout)

    async def _poll_workers(self) -> None:
        """Ask each alive node's worker for its status; but a worker that answered an
        exchange (``cluster.link``) within the last ``poll_s`` has shown it answers, so
        it is asked only when its last report is ``STATUS_EVERY_S`` old (its
        ``sandboxes_open`` is at most that stale while it is busy)."""
        now = time.monotonic()

        def due(node: ClusterNode) -> bool:
            answering = now - node.answered_at < self.config.poll_s
            if answering:
                node.unanswered = 0
            return not answering or now - node.reported_at >= STATUS_EVERY_S

        async def one(node: ClusterNode) -> None:
            try:
                report = WorkerReport.model_validate(
                    await self._bounded(node.actor.status.remote(), self.config.call_timeout)
                )
                node.sandboxes_open = report.sandboxes_open
                node.unanswered = 0
                node.reported_at = time.monotonic()
            except ActorUnavailableError as exc:  # it may be back soon: counted, as a silence
                self._unanswered(node, exc)
            except RayActorError as exc:
                self._mark_dead(node, f"its worker died ({type(exc).__name__})")
            except (RayError, TimeoutError) as exc:
                self._unanswered(node, exc)

        await asyncio.gather(*(one(n) for n in self.placement.nodes.values() if n.alive and due(n)))

    def _unanswered(self, node: ClusterNode, exc: BaseException) -> None:
        """A status poll not answered: the ``fence_after_polls``-th in a row fences the
        node (a worker that answers nothing may still run, and sample, on its own)."""
        node.unanswered += 1
        if node.alive and node.unanswered >= self.config.fence_after_polls:
            self._fence(
                node, f"its worker left {node.unanswered} status polls in a row unanswered (last: {type(exc).__name__})"
            )

    def _current_version(self) -> int | None:
        return self._policy_version() if self._policy_version is not None else None

    def _fence(self, node: ClusterNode, why: str) -> None:
        """A node whose worker did not answer (a pause, a resume, a weight load, its status polls) may
        run on, sampling under the wrong policy: kill its worker and count the node lost
        (its rollouts run again elsewhere; its raylet, if alive, gets a new worker)."""
        calls.kill(node.actor)
        self._mark_dead(node, why)

    def _mark_dead(self, node: ClusterNode, why: str) -> None:
        if node.alive:
            log.warning(
                "node %s (%s) lost: %s; its %d rollouts end their attempt",
                node.name,
                node.node_id[:12],
                why,
                len(node.hosted),
            )
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

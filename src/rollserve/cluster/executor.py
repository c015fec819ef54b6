"""The head's side of the cluster: ``RayExecutor`` runs each stage in the worker
actor of the node its rollout was placed on, and turns a lost node into ``NodeLost``
(the engine retries the rollout elsewhere or masks it); ``NodeWatch`` (watch.py)
finds the nodes and starts their workers. Stage calls and cleanups travel in batches,
one ``NodeLink`` (link.py) per node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

from rollserve.cluster import calls
from rollserve.cluster.link import LinkClosed, NodeLink
from rollserve.cluster.nodes import ClusterNode
from rollserve.cluster.protocol import RayConfig, StageCall, StageOutcome, WorkerSettings
from rollserve.cluster.watch import NodeWatch
from rollserve.contract import NodeStatus, Stage
from rollserve.engine.executor import CLEANUP_TIMEOUT
from rollserve.engine.rollout import Rollout
from rollserve.errors import InfraError, NodeLost
from rollserve.handlers.base import AgentHandler, Evaluation, judge_evaluation
from rollserve.llm.base import PauseMode
from rollserve.llm.routing import WeightUpdate, current_deadline

log = logging.getLogger(__name__)

NAMESPACE = "rollserve"


class RayExecutor(NodeWatch):
    """Stages run in the node workers of a Ray cluster (``engine.executor``)."""

    def __init__(
        self, config: RayConfig, settings: WorkerSettings, policy_version: Callable[[], int | None] | None = None
    ) -> None:
        super().__init__(config, settings, policy_version)
        self._where: dict[str, ClusterNode] = {}  # rollout id -> its node
        self._synced: set[str] = set()  # rollouts whose last stage call returned
        self._called: set[str] = set()  # rollouts whose attempt sent its node a stage call
        self._released: set[str] = set()  # rollouts whose node cleaned their attempt up with EVAL
        self._background: set[asyncio.Task[None]] = set()
        self._links: dict[str, NodeLink] = {}  # node key -> its batched calls

    # --- life cycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Join the cluster and start a worker on every node that offers the resource
        now (bounded); then keep watching for nodes that join or leave."""
        await asyncio.to_thread(
            ray.init, address=self.config.address, namespace=NAMESPACE, log_to_driver=False, ignore_reinit_error=True
        )
        await self._scan()
        await self.wait_started(self.config.worker_start_timeout)
        if not any(n.alive for n in self.placement.nodes.values()):
            log.warning(
                "no node offers the %r resource yet: rollouts wait (bounded by their total timeout) until one joins",
                self.config.resource,
            )
        self._watcher = asyncio.create_task(self._watch(), name="rollserve-ray-nodes")

    async def stop(self) -> None:
        tasks = [t for t in (self._watcher, *self._starting.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        links, self._links = list(self._links.values()), {}
        for link in links:
            log.info(
                "node %s: %d requests in %d Ray calls (%d polls); %d answers taken, %d of them unused",
                link.node.name,
                link.requests,
                link.calls,
                link.polls,
                link.answers,
                link.unused,
            )
        await asyncio.gather(*(link.aclose() for link in links))
        alive = [n for n in self.placement.nodes.values() if n.alive]
        stops = [self._bounded(n.actor.stop.remote(), self.config.call_timeout * 3) for n in alive]
        await asyncio.gather(*stops, return_exceptions=True)
        for node in alive:
            calls.kill(node.actor)
            # Gone for the head too: what the head's router does as it stops after this
            # (its backends removed, say) is sent to no worker (Ray is shut down below).
            node.alive = False
        await calls.wait_killed(self.config.call_timeout)
        await asyncio.to_thread(ray.shutdown)

    # --- the routers' control plane (a ``llm.routing.base.Follower`` of the head's) ---
    async def pause(self, mode: PauseMode, timeout: float | None) -> bool:
        """Pause every worker's router replica (each drains its own calls when ``mode``
        is ``finish``); a worker that joins later is paused as it joins."""
        async with self._control:  # a join's catch-up is before this or sees the pause
            self._paused = mode
            alive = [n for n in self.placement.nodes.values() if n.alive]
            # A node drains within ``wait`` (bounded even when the head's own wait is not);
            # one that does not answer within ``wait`` and the call's bound is fenced.
            wait = self.config.call_timeout if timeout is None else timeout
            bound = self.config.call_timeout + wait
            replies = await asyncio.gather(
                *(self._bounded(n.actor.pause.remote(mode, wait), bound) for n in alive), return_exceptions=True
            )
        drained = True
        for node, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):  # fenced: a killed worker samples nothing
                self._fence(node, f"its worker did not pause ({type(reply).__name__}: {reply})")
            elif reply is not True:
                drained = False
        return drained

    async def resume(self, policy_version: int | None) -> None:
        async with self._control:
            self._paused = None
            alive = [n for n in self.placement.nodes.values() if n.alive]
            replies = await asyncio.gather(
                *(self._bounded(n.actor.resume.remote(policy_version), self.config.call_timeout) for n in alive),
                return_exceptions=True,
            )
        for node, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):  # it may stamp an old version: fenced
                self._fence(node, f"its worker did not resume ({type(reply).__name__}: {reply})")

    async def weights_loaded(self, update: WeightUpdate, failed: list[str]) -> None:
        """The head's router loaded ``update`` (paused): every worker's replica names what
        the head's backends name now (the adapter; the base model after full weights),
        but the backends in ``failed`` (their load failed: they keep their name),
        loading nothing again; workers that join later are given it. A worker that does
        not confirm in ``call_timeout`` is fenced: it might sample the old model's name
        under the new policy version. Full weights when no adapter was in force (and no
        backend kept an older name) change no name: nothing is sent."""
        async with self._control:
            unchanged = update.lora is None and self._lora is None and not failed and not self._lora_failed
            self._lora, self._lora_failed = update.lora, list(failed)
            if unchanged:
                return
            alive = [n for n in self.placement.nodes.values() if n.alive]
            replies = await asyncio.gather(
                *(
                    self._bounded(n.actor.weights_loaded.remote(update.lora, failed), self.config.call_timeout)
                    for n in alive
                ),
                return_exceptions=True,
            )
        for node, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):
                self._fence(
                    node, f"its worker did not take the new weights' model name ({type(reply).__name__}: {reply})"
                )

    def backend_added(self, name: str, source: str, weight: float) -> None:
        """The head's router got a backend: every worker adds it (in the background,
        bounded); workers that start later are given it."""
        self._added[name] = (source, weight)
        self._backend_changes += 1
        self._broadcast("add_backend", source, weight)

    async def backend_removed(self, name: str, grace: float) -> None:
        self._removed.add(name)
        self._added.pop(name, None)
        if name in self._lora_failed:  # gone: one added later under its name names the adapter
            self._lora_failed = [n for n in self._lora_failed if n != name]
        self._backend_changes += 1
        alive = [n for n in self.placement.nodes.values() if n.alive]
        replies = await asyncio.gather(
            *(
                self._bounded(n.actor.remove_backend.remote(name, grace), grace + self.config.call_timeout)
                for n in alive
            ),
            return_exceptions=True,
        )
        for node, reply in zip(alive, replies):
            if isinstance(reply, BaseException):
                log.warning("removing backend %s on node %s failed: %s", name, node.name, reply)

    def _broadcast(self, method: str, *args: Any) -> None:
        async def one(node: ClusterNode) -> None:
            try:
                await self._bounded(getattr(node.actor, method).remote(*args), self.config.call_timeout)
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
        self._released.discard(r.id)
        self._called.add(r.id)
        node.busy[stage] += 1
        try:
            outcome = await self._link(node).stage(self._call(r, stage))
        except LinkClosed:
            node.lost += 1
            raise NodeLost(f"node {node.name} was lost during {stage} (attempt {r.attempt})", node.name) from None
        except ActorUnavailableError as exc:  # unreachable, maybe back soon: not marked dead,
            self._unanswered(node, exc)  # but counted: a node that stays so is fenced
            node.lost += 1
            raise NodeLost(
                f"node {node.name} was unreachable during {stage} (attempt {r.attempt}): {type(exc).__name__}",
                node.name,
            ) from None
        except RayActorError as exc:
            self._mark_dead(node, f"its worker died ({type(exc).__name__})")
            node.lost += 1
            raise NodeLost(
                f"node {node.name} died during {stage} (attempt {r.attempt}): {type(exc).__name__}", node.name
            ) from None
        except RayError as exc:
            raise InfraError(f"node {node.name}: {stage} call failed: {type(exc).__name__}: {str(exc)[:500]}") from None
        finally:
            node.busy[stage] -= 1
            node.done[stage] += 1
        await self._took(r, handler, stage, node, outcome)

    async def _took(
        self, r: Rollout, handler: AgentHandler, stage: Stage, node: ClusterNode, outcome: StageOutcome
    ) -> None:
        """A stage's answer from ``node``: copied into the rollout, its failure raised."""
        if not node.alive:  # fenced while the call ran: what it made is not used
            node.lost += 1
            raise NodeLost(f"node {node.name} was lost during {stage} (attempt {r.attempt})", node.name)
        self._synced.add(r.id)
        if stage == "eval":  # the worker cleaned the attempt up before it answered (``_call``)
            self._released.add(r.id)
        self._apply(r, outcome)
        if outcome.error is not None:
            outcome.error.raise_again()
        if stage == "eval" and r.judge is not None:
            await self._judge(r, handler)

    @staticmethod
    async def _judge(r: Rollout, handler: AgentHandler) -> None:
        """The task's judge reward, here on the head, where the judges are, on what the
        node's EVAL gave (the node's call carries no judge: ``_call``); within the EVAL
        stage's bound, as on one machine. A judge failure raises as it does there."""
        r.scored(
            await judge_evaluation(
                handler,
                r,
                Evaluation(
                    reward=r.reward if r.reward is not None else 0.0,
                    details=dict(r.evaluation or {}),
                    components=dict(r.reward_components or {}),
                ),
            )
        )

    def _call(self, r: Rollout, stage: Stage) -> StageCall:
        now = asyncio.get_running_loop().time()
        calls_end = current_deadline()
        return StageCall(  # (no judge: the head judges, see ``_judge``)
            spec=r.spec.model_copy(update={"judge": None}) if r.spec.judge else r.spec,
            attempt=r.attempt,
            stage=stage,
            max_turns=r.max_turns,
            max_context_tokens=r.max_context_tokens,
            timeouts=r.timeouts,
            max_staleness=r.max_staleness,
            mask_stale=r.mask_stale,
            rollout_left=None if r.deadline is None else r.deadline - now,
            calls_left=None if calls_end is None else calls_end - now,
            run_left=None if r.run_deadline is None or stage != "run" else r.run_deadline - now,
            release=stage == "eval",  # the last stage: its answer comes after the node's cleanup
        )

    @staticmethod
    def _apply(r: Rollout, outcome: StageOutcome) -> None:
        if outcome.trajectory is not None:
            r.trajectory = outcome.trajectory
        r.reward, r.evaluation = outcome.reward, outcome.evaluation
        r.reward_components = outcome.reward_components
        r.stats = dict(outcome.stats)
        for key, seconds in outcome.timing.items():
            r.timing[key] = seconds  # the handler's own keys; the head keeps its stage times

    async def cleanup(self, r: Rollout, handler: AgentHandler) -> None:
        """Release the rollout's slot; its worker ends what still runs and closes its
        sandboxes (bounded), unless the answer to its EVAL said it had (``StageCall.release``:
        then no call is sent). When its last stage call did not return (cut by a deadline
        or a cancel), what the worker had by then is copied back."""
        node = self._where.pop(r.id, None)
        synced = r.id in self._synced
        self._synced.discard(r.id)
        called = r.id in self._called
        self._called.discard(r.id)
        released = r.id in self._released  # EVAL answered: the worker cleaned it up already
        self._released.discard(r.id)
        if node is None:
            return
        try:
            if node.alive and called and not released:  # reserved only: the worker never heard of it
                outcome: StageOutcome | None = await asyncio.shield(
                    self._bounded(self._link(node).cleanup(r.id, r.attempt, not synced), CLEANUP_TIMEOUT)
                )
                if outcome is not None and not synced and node.alive:
                    self._apply(r, outcome)
        except LinkClosed:
            pass  # the node is lost: nothing of it to clean up from here
        except ActorUnavailableError as exc:  # maybe back soon: a missed answer, not a death
            self._unanswered(node, exc)
            log.error("cleanup of rollout %s on node %s failed: %s", r.id, node.name, exc)
        except RayActorError as exc:
            self._mark_dead(node, f"its worker died ({type(exc).__name__})")
        except (RayError, TimeoutError) as exc:
            log.error("cleanup of rollout %s on node %s failed: %s", r.id, node.name, exc)
        finally:
            node.hosted.discard(r.id)
            await self.placement.changed()

    def _link(self, node: ClusterNode) -> NodeLink:
        link = self._links.get(node.key)
        if link is None:
            link = NodeLink(node, self.config.call_timeout)
            if node.alive:
                self._links[node.key] = link
            else:  # (a caller that looked before it died): its requests end at once
                link.close("it was counted dead")
        return link

    def _mark_dead(self, node: ClusterNode, why: str) -> None:
        """The node is lost: its requests still waiting end now (``NodeLost``)."""
        super()._mark_dead(node, why)
        link = self._links.pop(node.key, None)
        if link is not None:
            link.close(why)

    def nodes(self) -> list[NodeStatus] | None:
        return self.placement.statuses()

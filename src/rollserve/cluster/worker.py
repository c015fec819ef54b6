"""A node's worker (one Ray actor per node): it builds its own handlers, sandbox
runtime (owner records in the node's state dir), scoring pool and router replica
from the server's settings, hosts its rollouts between their stages (their sandboxes
live on this node) and runs their stages as the head asks.

At start it reaps what a dead predecessor on this node left (``sandbox.reaper``: only
records whose owner is dead, only in this node's folder). Every stage call is bounded
by the deadline the head sent; cleanup ends a stage still running, then releases the
rollout's sandboxes.

The head sends its requests in batches and takes the answers in batches, both in
``exchange`` calls (``cluster.link``): stages to run, attempts to clean up, and every
answer ready (one exchange at a time waits here for the next), so a busy node costs the
head a few Ray calls per batch, not a few per rollout. An answer stays here until an
exchange acknowledges it.

A stage call can reach the worker after the cleanup of its attempt (a call the head's
link sent before the attempt was cancelled or cleaned up: only unsent ones are dropped,
see link.py): the worker
remembers the attempts it cleaned up (the newest ``CLEANED_KEPT``) and refuses their
stage calls, so no late INIT makes a sandbox nobody cleans up. A janitor cleans up,
and logs, a hosted rollout with no stage running whose deadline passed more than
``orphan_grace`` seconds ago (its head, or the head's cleanup call, is gone).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
from collections import OrderedDict, deque

from rollserve.agent.gateway import Gateway
from rollserve.cluster.protocol import (
    LinkItem,
    LinkReply,
    StageCall,
    StageError,
    StageOutcome,
    WorkerReport,
    WorkerSettings,
)
from rollserve.engine.executor import CLEANUP_TIMEOUT, LocalExecutor
from rollserve.engine.rollout import Rollout
from rollserve.errors import RolloutError
from rollserve.handlers import HandlerRegistry, ScoringPool
from rollserve.handlers.base import AgentHandler, HandlerContext
from rollserve.llm.backends import backend_from_spec
from rollserve.llm.base import PauseMode
from rollserve.llm.routing import Router, call_deadline
from rollserve.llm.tokens import load_tokenizer
from rollserve.sandbox.reaper import reap
from rollserve.sandbox.registry import LazyRuntime

log = logging.getLogger(__name__)

# The worker's own bound on a stage is the head's deadline plus this: the head's fires
# first (and ends the attempt, whose cleanup stops the call); this one only ends a call
# whose cleanup never came (its head gone or cut off).
DEADLINE_GRACE = 5.0
# The attempts (rollout id, attempt) cleaned up that a worker remembers: the newest ones.
CLEANED_KEPT = 100_000
# A poll that waited for an answer waits this much longer for the answers that end with
# it or soon after (the stages of rollouts that started together end together): one reply,
# not several (each Ray call costs the head's process CPU: its Python side and Ray's
# threads, docs/benchmarks.md); it adds at most 20 ms to a stage's answer.
GATHER_S = 0.02


class NodeWorker:
    """Runs on one node; the head calls ``start`` once, then ``run_stage``, ``cleanup``
    and ``status`` (concurrently: an async actor)."""

    def __init__(self, settings_json: str) -> None:
        self.settings = WorkerSettings.model_validate_json(settings_json)
        self.rollouts: dict[str, Rollout] = {}
        self._running: dict[str, asyncio.Task[StageOutcome]] = {}
        self.reaped = 0
        self.reap_errors: list[str] = []
        self._started = False
        self._cleaned: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._cleanups: dict[tuple[str, int], asyncio.Future[None]] = {}  # in flight
        self._janitor: asyncio.Task[None] | None = None
        self.orphans = 0  # rollouts the janitor cleaned up
        self._answering: set[asyncio.Task[None]] = set()  # the requests of ``exchange`` under way
        self._replies: deque[LinkReply] = deque()  # answered, not yet acknowledged by the head
        self._replied = 0  # the last reply's seq
        self._ready = asyncio.Event()  # a reply came since the last poll took them

    async def start(self) -> WorkerReport:
        """Reap a dead predecessor's sandboxes on this node, then build the stack."""
        s = self.settings
        folder = s.node_state_dir
        folder.mkdir(parents=True, exist_ok=True)
        report = await asyncio.to_thread(reap, folder)
        self.reaped, self.reap_errors = len(report.reaped), report.errors
        if report.reaped:
            log.warning("node %s: reaped %d sandboxes of a dead worker", s.node, len(report.reaped))
        self.tokenizer = load_tokenizer(s.tokenizer)
        self.scoring = ScoringPool(workers=s.scoring_workers, default_timeout=s.scoring_timeout)
        await self.scoring.astart()
        self.router = Router(policy_version=s.policy_version, config=s.llm)
        removed = set(s.removed_backends)  # removed from the head's router since it started
        for spec in s.backends:
            backend = backend_from_spec(spec)
            if backend.name not in removed:  # (one that cannot serve the adapter, say)
                self.router.add(backend)
        for source, weight in s.added_backends:  # added to it since
            self.add_backend(source, weight)
        if s.lora is not None:  # its backends name the head's adapter (loaded by the head),
            # but those whose load failed there; so do backends added later
            self.router.adopt_weights(s.lora, s.lora_failed)
        await self.router.start()
        self.sandboxes = LazyRuntime(s.sandbox_runtime, folder, s.sandbox_options)
        self.context = HandlerContext(
            tokenizer=self.tokenizer,
            scoring=self.scoring,
            sandboxes=self.sandboxes,
            options=s.handler_options,
            gateway=Gateway(),
            seed_salt=s.seed_salt,
            harness_dir=s.harness_dir,
        )
        self.handlers = HandlerRegistry()
        self.executor = LocalExecutor(self.router)
        self._started = True
        self._janitor = asyncio.create_task(self._sweep(), name="rollserve-worker-janitor")
        return self.status()

    def status(self) -> WorkerReport:
        return WorkerReport(
            node=self.settings.node,
            pid=os.getpid(),
            hosted=len(self.rollouts),
            running=len(self._running),
            sandboxes_open=len(self.sandboxes.open_sandboxes()) if self._started else 0,
            reaped_at_start=self.reaped,
            reap_errors=self.reap_errors,
        )

    def _handler(self, data_source: str) -> AgentHandler:
        return self.handlers.create(data_source, self.context)

    async def _rollout(self, call: StageCall) -> Rollout | str:
        """The attempt's rollout (INIT makes it), or why there is none to run."""
        where = f"rollout {call.spec.id} attempt {call.attempt}"
        if (call.spec.id, call.attempt) in self._cleaned:
            return f"{where} was cleaned up on node {self.settings.node} before this {call.stage} call came"
        r = self.rollouts.get(call.spec.id)
        if call.stage == "init" and r is not None and r.attempt < call.attempt:
            # An earlier attempt still hosted (its cleanup call lost): it ends now.
            log.warning(
                "node %s: rollout %s attempt %d still hosted at attempt %d's INIT; cleaning it up",
                self.settings.node,
                r.id,
                r.attempt,
                call.attempt,
            )
            await self.cleanup(r.id, r.attempt, produced=False)
            if (call.spec.id, call.attempt) in self._cleaned:  # meanwhile
                return f"{where} was cleaned up on node {self.settings.node} before its INIT ran"
            r = self.rollouts.get(call.spec.id)
        if call.stage == "init" and r is None:
            r = Rollout(
                spec=call.spec,
                attempt=call.attempt,
                max_turns=call.max_turns,
                max_context_tokens=call.max_context_tokens,
                timeouts=call.timeouts,
                max_staleness=call.max_staleness,
                mask_stale=call.mask_stale,
            )
            self.rollouts[r.id] = r
        if r is None or r.attempt != call.attempt or (call.stage == "init" and r.id in self._running):
            return f"{where} is not hosted on node {self.settings.node} (its worker restarted?)"
        return r

    async def run_stage(self, call: StageCall) -> StageOutcome:
        r = await self._rollout(call)
        if isinstance(r, str):
            return StageOutcome(error=StageError("infra", r))
        task = asyncio.create_task(self._stage(r, call))
        self._running[r.id] = task
        try:
            return await task
        finally:
            if self._running.get(r.id) is task:
                del self._running[r.id]

    async def _stage(self, r: Rollout, call: StageCall) -> StageOutcome:
        now = asyncio.get_running_loop().time()
        r.deadline = None if call.rollout_left is None else now + call.rollout_left
        calls_end = None if call.calls_left is None else now + call.calls_left
        if call.stage == "run":
            r.run_deadline = None if call.run_left is None else now + call.run_left
        handler = self._handler(r.spec.data_source)
        error: StageError | None = None
        try:
            async with asyncio.timeout(None if calls_end is None else calls_end + DEADLINE_GRACE):
                with call_deadline(r.deadline), call_deadline(calls_end):
                    await self.executor.run_stage(r, handler, call.stage)
        except RolloutError as exc:
            error = StageError.of(exc)
        except TimeoutError:
            error = StageError("timeout", f"{call.stage} outran its deadline on node {self.settings.node}")
        except Exception as exc:  # a handler's bug: an infra failure, as the pipeline words it
            log.exception("rollout %s failed in %s", r.id, call.stage)
            error = StageError("bug", f"{type(exc).__name__}: {exc}")
        return self._outcome(r, error)

    @staticmethod
    def _outcome(r: Rollout, error: StageError | None) -> StageOutcome:
        return StageOutcome(
            error=error,
            trajectory=r.trajectory,
            reward=r.reward,
            evaluation=r.evaluation,
            reward_components=r.reward_components,
            timing=dict(r.timing),
            stats=dict(r.stats),
        )

    async def cleanup(self, rollout_id: str, attempt: int, produced: bool) -> StageOutcome | None:
        """End the rollout's stage if one still runs, release what it took, forget it;
        ``produced``: return what it had produced (else, or when it is not hosted
        here, None). The attempt's stage calls that come later are refused."""
        self._cleaned[(rollout_id, attempt)] = None
        self._cleaned.move_to_end((rollout_id, attempt))
        while len(self._cleaned) > CLEANED_KEPT:
            self._cleaned.popitem(last=False)
        r = self.rollouts.get(rollout_id)
        if r is None or r.attempt != attempt:
            return None
        # Once per attempt: the node's own cleanup after EVAL and the head's (its wait for
        # the EVAL cut meanwhile) may meet here; the second waits for the first.
        key = (rollout_id, attempt)
        running = self._cleanups.get(key)
        if running is None:
            running = self._cleanups[key] = asyncio.ensure_future(self._clean(rollout_id, r))
            running.add_done_callback(lambda _: self._cleanups.pop(key, None))
        await asyncio.shield(running)  # a caller cancelled leaves the cleanup to finish
        return self._outcome(r, None) if produced else None

    async def _clean(self, rollout_id: str, r: Rollout) -> None:
        task = self._running.get(rollout_id)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=CLEANUP_TIMEOUT)
        await self.executor.cleanup(r, self._handler(r.spec.data_source))
        if self.rollouts.get(rollout_id) is r:
            del self.rollouts[rollout_id]

    async def exchange(self, payload: bytes | None, ack: int, wait: float) -> list[LinkReply]:
        """Start the head's requests in ``payload`` (a ``list[LinkItem]`` the head pickled
        itself), drop the answers up to ``ack`` (the last seq the head took), and return
        those after it, once there is one or ``wait`` seconds passed (then maybe none);
        none when it delivers requests without waiting (``wait`` 0)."""
        if payload is not None:
            items: list[LinkItem] = pickle.loads(payload)
            for item in items:
                task = asyncio.create_task(self._answer(item))
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
        while self._replies and self._replies[0].seq <= ack:
            self._replies.popleft()
        if payload is not None and wait <= 0:
            # Only delivering (the head sends those while its wait for answers is on its
            # way here): that wait takes the answers; returned here too, each would cross
            # twice and the head unpickle it twice.
            return []
        if not self._replies and wait > 0:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), wait)
                await asyncio.sleep(GATHER_S)  # the answers that end with this one
            except TimeoutError:
                pass
        return list(self._replies)

    async def _release(self, call: StageCall) -> None:
        """Clean up the attempt whose last stage ``call`` was (``StageCall.release``): the
        head sends no cleanup after it. A failure here is logged; the stage's answer stands."""
        try:
            await self.cleanup(call.spec.id, call.attempt, produced=False)
        except Exception:
            log.exception(
                "node %s: cleanup of rollout %s after its %s failed", self.settings.node, call.spec.id, call.stage
            )

    async def _answer(self, item: LinkItem) -> None:
        reply = LinkReply(seq=0, id=item.id)
        try:
            if item.call is not None:
                reply.outcome = await self.run_stage(item.call)
                if item.call.release:  # its last stage: the attempt is cleaned up before the answer
                    await self._release(item.call)
            elif item.cleanup is not None:
                reply.outcome = await self.cleanup(*item.cleanup)
            else:
                reply.error = "an empty request"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # this answer itself is stopped (the worker stops)
                raise
            reply.error = "cancelled on the node"  # its stage was ended by its cleanup
        except Exception as exc:
            log.exception("node %s: request %d failed", self.settings.node, item.id)
            reply.error = f"{type(exc).__name__}: {exc}"
        self._replied += 1
        reply.seq = self._replied
        self._replies.append(reply)
        self._ready.set()

    async def _sweep(self) -> None:
        """The janitor: every ``janitor_s``, clean up the hosted rollouts that no stage
        runs for and whose deadline passed ``orphan_grace`` seconds ago."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.janitor_s)
            now = loop.time()
            for rollout_id, r in list(self.rollouts.items()):
                if rollout_id in self._running or r.deadline is None or now < r.deadline + self.settings.orphan_grace:
                    continue
                log.warning(
                    "node %s: rollout %s attempt %d outlived its deadline by %.0f s "
                    "with no stage running and no cleanup from the head; cleaning it up",
                    self.settings.node,
                    rollout_id,
                    r.attempt,
                    now - r.deadline,
                )
                try:
                    await self.cleanup(rollout_id, r.attempt, produced=False)
                    self.orphans += 1
                except Exception:
                    log.exception("node %s: cleaning up rollout %s failed", self.settings.node, rollout_id)

    async def pause(self, mode: PauseMode, timeout: float | None) -> bool:
        """Pause the node's router replica (the head forwards pauses to backends);
        True once none of its calls is in flight."""
        reply = await self.router.pause(mode, timeout, forward=False)
        return bool(reply["drained"])

    async def resume(self, policy_version: int | None) -> None:
        await self.router.resume(policy_version, allow_lower=True)  # the head decided

    async def weights_loaded(self, lora: str | None, skip: list[str]) -> None:
        """The head loaded weights into the backends' servers (while paused): from now
        on the replica's backends, but those in ``skip`` (their load failed), name
        ``lora`` (None: the base model); nothing is loaded again."""
        self.router.adopt_weights(lora, skip)

    def add_backend(self, source: str, weight: float) -> None:
        """Register a backend the head's router got at run time (``source``: its spec)."""
        backend = backend_from_spec(source)
        if not self.router.is_registered(backend.name):
            self.router.add(backend, weight)

    async def remove_backend(self, name: str, grace: float) -> None:
        if self.router.is_registered(name):
            await self.router.remove(name, grace=grace)

    async def stop(self) -> None:
        """Close what is still open (the head is shutting down)."""
        if self._janitor is not None:
            self._janitor.cancel()
            await asyncio.gather(self._janitor, return_exceptions=True)
        for rollout_id, r in list(self.rollouts.items()):
            await self.cleanup(rollout_id, r.attempt, produced=False)
        await self.sandboxes.aclose()
        await self.router.stop()
        await self.scoring.aclose()
        await self.tokenizer.close()

"""The engine: one asyncio task per rollout moving it through INIT → RUN → EVAL.

Each stage has its own pool (a concurrency limit with a FIFO queue in front); a
rollout holds a stage's slot only while that stage runs. Every stage and the
whole rollout run under deadlines; a timeout, a cancellation or an error ends the
rollout with a typed failure, and the handler's cleanup always runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass

from rollserve.contract import (
    STAGES,
    TERMINAL,
    EngineStatus,
    Failure,
    Recovered,
    RolloutStatus,
    Stage,
    TerminalStatus,
    TrajectoryCounters,
)
from rollserve.engine import recovery
from rollserve.engine.config import EngineConfig, new_rollout
from rollserve.engine.events import EventBus
from rollserve.engine.executor import CLEANUP_TIMEOUT, LocalExecutor, Sessions, StageExecutor
from rollserve.engine.groups import EARLY_STOP_MESSAGE, GroupTracker, result_usable
from rollserve.engine.outcome import StageTimeout, Where, end_with_error, mask_kind, stage_limit, tally
from rollserve.engine.pools import StagePool, StartGate
from rollserve.engine.priority import background_context
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.engine.stage_metrics import StageLatency
from rollserve.engine.store import Store
from rollserve.errors import NodeLost, RolloutError
from rollserve.handlers import HandlerRegistry
from rollserve.handlers.base import AgentHandler, HandlerContext, HandlerDefaults
from rollserve.llm.routing import call_deadline

log = logging.getLogger(__name__)

__all__ = ["CLEANUP_TIMEOUT", "Engine", "EngineConfig", "Sessions"]


START_PER_PASS = 32  # rollouts that take their first steps in one pass of the event loop
STOP_PER_PASS = 1024  # rollouts a stop cancels in one pass of the event loop
STOP_IDLE = CLEANUP_TIMEOUT + 30  # a stop gives up waiting once none of its rollouts ended in this long
COMPLETION_SECONDS = 3600  # the longest window ``throughput`` counts over
INLINE_RESULT_TOKENS = 4096  # a result with at most this many ids is built on the loop
INLINE_RESULT_MESSAGES = 64  # ... in at most this many messages
INLINE_RESULT_CHARS = 65_536  # ... of at most this many characters of text


def small_result(r: Rollout) -> bool:
    """Whether ``r``'s result is small enough to build and validate on the event loop."""
    traj = r.trajectory
    if traj.auxiliary or len(traj.messages) > INLINE_RESULT_MESSAGES:
        return False
    tokens = len(traj.input_ids) + sum(len(s.input_ids) for s in traj.closed)
    chars = sum(len(c) if isinstance(c := m.get("content"), str) else INLINE_RESULT_CHARS + 1 for m in traj.messages)
    return tokens <= INLINE_RESULT_TOKENS and chars <= INLINE_RESULT_CHARS


@dataclass
class _Progress:
    """Where a rollout in flight stands, as its failure would name it."""

    stage: Where = "queue"


class Engine:
    def __init__(
        self,
        store: Store,
        handlers: HandlerRegistry,
        router: Sessions,
        config: EngineConfig | None,
        context: HandlerContext,
        executor: StageExecutor | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        # Where stages run: this process (the default), or a cluster's nodes.
        self.executor: StageExecutor = executor or LocalExecutor(router)
        self.context = context
        self.store = store
        self.handlers = handlers
        self.router = router
        self.events = EventBus()
        self.pools: dict[Stage, StagePool] = {
            "init": StagePool("init", self.config.init_workers),
            "run": StagePool("run", self.config.run_workers),
            "eval": StagePool("eval", self.config.eval_workers),
        }
        self.latency = StageLatency()  # per-stage wait and run times (``/metrics``)
        self.starts = StartGate(START_PER_PASS)  # a big batch starts over several loop passes
        self.live: dict[str, Rollout] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_requested: dict[str, str] = {}  # rollout id -> why, as its failure says
        # Rollouts whose drive has begun: a task cancelled before its first step never
        # runs its body (nor its except clauses), so one not begun is told by a flag.
        self._begun: set[str] = set()
        self.groups = GroupTracker()
        self._finished: dict[str, asyncio.Event] = {}
        # Rollouts finished per whole second of the monotonic clock, the last hour's:
        # a rate over any window up to that is a sum over at most its seconds.
        self._completions: deque[list[int]] = deque(maxlen=COMPLETION_SECONDS)  # [second, count]
        self._live_counts: Counter[RolloutStatus] = Counter()  # in flight, by status (``Rollout.tally``)
        self.counters: dict[TerminalStatus, int] = {}
        # Masked results by why (a failure's kind, or stale) and stage: ``/metrics``.
        self.masked: dict[tuple[str, str], int] = {}
        # Over finished rollouts: token-fidelity mismatches, turns cut by max_tokens, stale.
        self.trajectory_counters = TrajectoryCounters(
            fidelity_mismatches=0, rollouts_with_mismatches=0, truncated_turns=0, stale=0, not_trainable=0
        )
        self.reserved = 0  # admitted by a submit still writing to the store
        # Held by a submit from its client-id lookups to its insert (engine.submit): two
        # identical submits cannot both miss the id and race to store it.
        self.admission = asyncio.Lock()
        self.last_seq = 0  # the newest result's cursor position
        self.started_at = time.time()
        self.recovered = Recovered()  # what start() found unfinished
        self._janitor: asyncio.Task[None] | None = None

    # --- life cycle -----------------------------------------------------------------
    async def start(self) -> Recovered:
        """Recover what a previous server left unfinished, then start the janitor."""
        self.last_seq = await self.store.last_seq()
        self.recovered = await self._recover()
        self._janitor = asyncio.create_task(self._purge_loop(), name="rollserve-janitor")
        return self.recovered

    def begin_shutdown(self) -> None:
        """The service is about to stop: long-polls and event streams end now, answering
        what they have, so the HTTP server's graceful shutdown does not wait for them."""
        self.events.close()

    async def stop(self) -> None:
        """Stop every rollout in flight without finishing it: a restart re-queues it.

        The newest are cancelled first, ``STOP_PER_PASS`` per pass of the event loop: no
        pass runs every rollout's unwinding at once, and a rollout cancelled while queued
        (for a stage's slot, a connection) leaves its queue in O(1) (``llm.slots``). The
        stage pools are closed first, so a slot given back meanwhile starts no stage for
        a rollout about to be cancelled. The wait is bounded: it ends once every rollout
        has ended, or when none has for ``STOP_IDLE`` seconds (each cleanup is bounded by
        ``CLEANUP_TIMEOUT``; what one left, the service's stop closes after)."""
        self.begin_shutdown()
        if self._janitor:
            self._janitor.cancel()
        for pool in self.pools.values():
            pool.close()
        tasks = list(self._tasks.values())
        for end in range(len(tasks), 0, -STOP_PER_PASS):
            for task in tasks[max(0, end - STOP_PER_PASS) : end]:
                task.cancel()
            await asyncio.sleep(0)  # the next pass: these unwind while the next are cancelled
        await self._wait_stopped(tasks)

    async def _wait_stopped(self, tasks: list[asyncio.Task[None]]) -> None:
        pending = {task for task in tasks if not task.done()}
        while pending:
            before = len(pending)
            _, pending = await asyncio.wait(pending, timeout=STOP_IDLE)
            if pending and len(pending) == before:
                log.error(
                    "stop: %d rollouts did not end in %g s after being cancelled; not waiting for them",
                    len(pending),
                    STOP_IDLE,
                )
                return

    async def _recover(self) -> Recovered:
        counts: Counter[recovery.Verdict] = Counter()
        for row in await self.store.unfinished():
            verdict = await recovery.verdict(self.store, row, self.config)
            counts[verdict] += 1
            if verdict == "requeued":
                await self.store.set_status(row.id, "queued", attempt=row.attempt + 1)
                self._launch(self._new_rollout(row.spec, row.attempt + 1), admitted=False)
                continue
            rollout = self._new_rollout(row.spec, row.attempt)
            rollout.status, rollout.failure = recovery.ending(verdict, row, self.config)
            await self._record_result(rollout)
            if verdict == "cancelled":
                self.groups.early_stopped()
        recovered = Recovered(
            requeued=counts["requeued"], interrupted=counts["interrupted"], cancelled=counts["cancelled"]
        )
        if counts:
            log.warning(
                "recovered %d unfinished rollouts: %d re-queued, %d interrupted, %d "
                "cancelled (extras of groups that had their n usable samples)",
                counts.total(),
                recovered.requeued,
                recovered.interrupted,
                recovered.cancelled,
            )
        return recovered

    # --- admission ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._tasks)

    def room(self) -> int:
        return self.config.max_pending - self.pending - self.reserved

    def retry_after(self) -> float:
        """A hint for 429s: roughly how long until a batch's worth of room frees up."""
        rate = self.throughput(window=60.0)
        return 5.0 if rate <= 0 else max(1.0, min(60.0, self.config.max_pending * 0.1 / rate))

    def handler(self, data_source: str) -> AgentHandler:
        return self.handlers.create(data_source, self.context)

    def _new_rollout(self, spec: RolloutSpec, attempt: int) -> Rollout:
        return new_rollout(spec, attempt, self.handler(spec.data_source).defaults, self.config)

    def launch(self, specs: list[RolloutSpec]) -> None:
        """Start rollouts already written to the store (the caller checked room())."""
        defaults: dict[str, HandlerDefaults] = {}  # (a group's specs share their data source)
        for spec in specs:
            if spec.data_source not in defaults:
                defaults[spec.data_source] = self.handler(spec.data_source).defaults
            self._launch(new_rollout(spec, 1, defaults[spec.data_source], self.config))

    def _launch(self, rollout: Rollout, admitted: bool = True) -> None:
        self.live[rollout.id] = rollout
        rollout.tally = self._live_counts
        self.groups.started(rollout.spec, admitted)
        self._finished[rollout.id] = asyncio.Event()
        # Background: on the server's loop the API's requests run ahead of it (engine.priority).
        drive = self._drive(rollout)
        self._tasks[rollout.id] = asyncio.create_task(drive, name=rollout.id, context=background_context())
        self.events.publish(rollout.id, rollout.spec.group_id, "queued")

    # --- cancellation ---------------------------------------------------------------
    def cancel(self, rollout_id: str, why: str = "cancelled by the client") -> bool:
        """Stop a rollout in flight (True) or do nothing if it is not running (False).
        One whose stages are over (cleaning up, storing its result) keeps its result."""
        task = self._tasks.get(rollout_id)
        live = self.live.get(rollout_id)
        if task is None or task.done() or live is None or live.status in TERMINAL:
            return False
        self._cancel_requested.setdefault(rollout_id, why)
        if rollout_id in self._begun:
            task.cancel()
        # else: its drive, at its first step, finds the request and ends it cancelled
        return True

    # --- the pipeline ---------------------------------------------------------------
    async def _drive(self, r: Rollout) -> None:
        self._begun.add(r.id)
        handler = self.handler(r.spec.data_source)
        started = time.perf_counter()
        at = _Progress()
        try:
            async with asyncio.timeout(r.timeouts.total) as deadline:
                r.deadline = deadline.when()
                await self.starts.turn()  # queued (and cancellable) until its turn
                if r.id in self._cancel_requested:  # cancelled before it began
                    raise asyncio.CancelledError
                while await self._attempt(r, handler, at):
                    at.stage = "queue"  # a new attempt, from INIT, on another node
        except TimeoutError:
            if not deadline.expired():
                raise
            r.status = "timed_out"
            r.failure = Failure(
                stage=at.stage,
                kind="timeout",
                message=f"rollout deadline of {r.timeouts.total:g}s passed in {at.stage}",
            )
        except asyncio.CancelledError:
            if r.id not in self._cancel_requested:
                # Server shutting down: leave the rollout unfinished in the store so
                # the next start re-queues it.
                await self._cleanup(r, handler)
                self._forget(r)
                raise
            r.status = "cancelled"
            r.failure = Failure(stage=at.stage, kind="infra", message=self._cancel_requested[r.id])
        r.add_time("total", time.perf_counter() - started)
        await self._cleanup(r, handler)
        try:
            await self._record_result(r)
        except Exception:  # the store failed: the row stays unfinished, so the next start recovers it
            log.exception(
                "could not store the result of rollout %s; it stays unfinished in "
                "the store and is recovered at the next start",
                r.id,
            )
        finally:
            self._forget(r)  # never leave it counted as in flight

    async def _attempt(self, r: Rollout, handler: AgentHandler, at: _Progress) -> bool:
        """Run the stages once; True when a lost node calls for another attempt. An error
        ends the rollout (``outcome.end_with_error``); a timeout or cancellation propagates."""
        try:
            # A place to run (a cluster node's slot), waited for outside INIT's pool and
            # timeout: only the rollout's deadline bounds it.
            await self.executor.reserve(r)
            for stage in STAGES:
                at.stage = stage
                await self._run_stage(r, handler, stage)
            r.status = "completed"
        except NodeLost as exc:
            if r.attempt < self.config.max_attempts:
                await self._retry(r, handler, exc)
                return True
            end_with_error(r, at.stage, exc)
        except (RolloutError, StageTimeout) as exc:  # before TimeoutError: ScoringTimeout is both
            end_with_error(r, at.stage, exc)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:  # a handler bug: an infra failure, typed
            log.exception("rollout %s failed in %s", r.id, at.stage)
            end_with_error(r, at.stage, exc)
        return False

    async def _run_stage(self, r: Rollout, handler: AgentHandler, stage: Stage) -> None:
        async with self.pools[stage].slot() as queued:
            r.add_time("queued", queued)
            r.add_time(f"queued_{stage}", queued)
            self.latency.waited(stage, r.spec.data_source, queued)
            r.status = stage
            self.events.publish(r.id, r.spec.group_id, stage)
            await self.store.set_status(r.id, stage)
            limit = stage_limit(r.timeouts, stage)
            started = time.perf_counter()
            try:
                async with asyncio.timeout(limit) as stage_deadline:
                    if stage == "run":
                        ends = [w for w in (r.deadline, stage_deadline.when()) if w is not None]
                        r.run_deadline = min(ends) if ends else None
                    # LLM calls see the earlier of the stage's and the rollout's deadlines.
                    with call_deadline(r.deadline), call_deadline(stage_deadline.when()):
                        await self._stage_body(r, handler, stage)
            except TimeoutError:
                if stage_deadline.expired():
                    raise StageTimeout(f"{stage} stage exceeded its timeout of {limit:g}s") from None
                raise
            finally:
                ran = time.perf_counter() - started
                r.add_time(stage, ran)
                self.latency.ran(stage, r.spec.data_source, ran)

    async def _stage_body(self, r: Rollout, handler: AgentHandler, stage: Stage) -> None:
        await self.executor.run_stage(r, handler, stage)

    async def _cleanup(self, r: Rollout, handler: AgentHandler) -> None:
        """Release what the handler took; bounded, and shielded from cancellation."""
        await self.executor.cleanup(r, handler)

    async def _retry(self, r: Rollout, handler: AgentHandler, lost: NodeLost) -> None:
        """End the attempt a dead node cut short and queue the rollout again, as a new
        attempt that starts from INIT (what the attempt produced is dropped)."""
        await self._cleanup(r, handler)
        log.warning("rollout %s: attempt %d ended (%s); running it again", r.id, r.attempt, lost.message)
        r.new_attempt()
        r.status = "queued"
        await self.store.set_status(r.id, "queued", attempt=r.attempt)
        self.events.publish(r.id, r.spec.group_id, "queued")

    async def _record_result(self, r: Rollout) -> None:
        r.finished_at = time.time()
        # A long episode's result is megabytes of token ids (1M of them took 0.8 s to
        # validate, which would stall the event loop): built on a worker thread. A small
        # one (a math episode's hundred ids: tens of microseconds) is built here, as the
        # hop to a thread and back costs more than the work.
        if small_result(r):
            result = r.final_result()
        else:
            result = await asyncio.to_thread(r.final_result)
        seq = await asyncio.shield(self.store.finish(result))
        self.last_seq = max(self.last_seq, seq)
        self.counters[result.status] = self.counters.get(result.status, 0) + 1
        if result.mask:
            key = mask_kind(r)
            self.masked[key] = self.masked.get(key, 0) + 1
        tally(self.trajectory_counters, r, result)
        second = int(time.monotonic())
        if self._completions and self._completions[-1][0] == second:
            self._completions[-1][1] += 1
        else:
            self._completions.append([second, 1])
        self.events.publish(r.id, r.spec.group_id, r.status, reward=r.reward, mask=r.mask, final=True)
        # The group's verdict before the waiters wake: once told, they see the group as
        # it now stands (its extras already being cancelled).
        try:
            extras = await self.groups.on_result(self.store, r.spec, result_usable(result))
        except Exception:  # the verdict is bookkeeping: never lose the result over it
            log.exception("could not judge the group of rollout %s", r.id)
            extras = []
        for rollout_id in extras:
            if self.cancel(rollout_id, EARLY_STOP_MESSAGE):
                self.groups.early_stopped()
        event = self._finished.get(r.id)
        if event:
            event.set()

    def _forget(self, r: Rollout) -> None:
        if self.live.pop(r.id, None) is not None:
            self._live_counts[r.status] -= 1
            r.tally = None
        self._tasks.pop(r.id, None)
        event = self._finished.pop(r.id, None)
        if event is not None:
            event.set()  # wake waiters even when no result could be stored
        self._cancel_requested.pop(r.id, None)
        self._begun.discard(r.id)
        self.groups.ended(r.spec)

    # --- waiting and reporting ------------------------------------------------------
    async def wait_finished(self, rollout_ids: list[str], timeout: float) -> None:
        """Wait (bounded) until none of ``rollout_ids`` is in flight any more, or the
        service begins to shut down (``begin_shutdown``)."""
        events = [self._finished[i] for i in rollout_ids if i in self._finished]
        if not events or timeout <= 0 or self.events.closing.is_set():
            return
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        every = asyncio.ensure_future(asyncio.wait(waits))
        closing = asyncio.ensure_future(self.events.closing.wait())  # a shutdown ends it
        try:
            await asyncio.wait((every, closing), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (*waits, every, closing):
                w.cancel()

    def throughput(self, window: float = 60.0) -> float:
        """Rollouts finished per second over the last ``window`` seconds."""
        now = time.monotonic()
        recent = 0
        for second, count in reversed(self._completions):  # newest first: stops at the window
            if now - second > window + 1:  # (a whole second counts while any of it is inside)
                break
            recent += count
        elapsed = max(min(window, time.time() - self.started_at), 1e-3)
        return recent / elapsed

    def status(self) -> EngineStatus:
        live_by_status = {status: count for status, count in self._live_counts.items() if count}
        return EngineStatus(
            uptime_s=round(time.time() - self.started_at, 3),
            in_flight=self.pending,
            max_pending=self.config.max_pending,
            stages={name: pool.snapshot() for name, pool in self.pools.items()},
            live=live_by_status,
            finished=dict(self.counters),  # since this server started
            trajectories=self.trajectory_counters.model_copy(),  # over those finished rollouts
            groups=self.groups.counters.model_copy(),
            last_seq=self.last_seq,
            throughput_per_s=round(self.throughput(60.0), 4),
            handlers=self.handlers.names(),
            recovered_at_start=self.recovered,
            nodes=self.executor.nodes(),
        )

    async def _purge_loop(self) -> None:
        while True:
            try:
                removed = await self.store.purge(time.time() - self.config.retention_s)
                if removed:
                    log.info("retention: removed %d results", removed)
            except Exception:
                log.exception("retention purge failed")
            await asyncio.sleep(min(3600.0, self.config.retention_s / 10))

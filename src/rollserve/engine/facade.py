"""The engine's operations, as a front end calls them: contract models in and out,
typed errors (``engine.errors``) for what is refused, and every wait bounded.

``rollserve.api`` serves these over HTTP (and maps each error to a status code);
nothing outside the engine reads its rollouts in flight, its pools or its store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rollserve.contract import (
    TERMINAL,
    Accepted,
    CancelResponse,
    EngineStatus,
    GroupCancelResponse,
    GroupMember,
    GroupView,
    NodeStatus,
    ResultsPage,
    ResultSummaryPage,
    RolloutResult,
    RolloutStatus,
    RolloutView,
    RunRequest,
    RunResponse,
    StateEvent,
    SubmitRequest,
)
from rollserve.contract.judge import RescoreRequest, RescoreResponse
from rollserve.engine.errors import NotFound, UnknownDataSource
from rollserve.engine.groups import Outcome, judge
from rollserve.engine.pipeline import Engine
from rollserve.engine.requests import RequestLimits
from rollserve.engine.rescore import Rescores
from rollserve.engine.store import COUNT_CAP, SummaryFilter
from rollserve.engine.submit import submit
from rollserve.handlers import UnknownDataSource as UnknownHandler

CANCEL_WAIT = 30.0  # seconds a cancel waits for the rollout's cleanup and result


class Rollouts:
    """Submit, watch, read and cancel rollouts; the engine's status."""

    def __init__(self, engine: Engine, limits: RequestLimits | None = None) -> None:
        self._engine = engine
        self._store = engine.store
        self.limits = limits or RequestLimits()
        self.rescores = Rescores(engine)

    # --- admission --------------------------------------------------------------------
    async def submit(self, request: SubmitRequest) -> list[Accepted]:
        """Admit the whole batch or refuse it whole (``InvalidTask`` and its kinds,
        ``QueueFull``)."""
        return await submit(self._engine, request, self.limits)

    async def rescore(self, request: RescoreRequest) -> RescoreResponse:
        """EVAL again on stored results (``engine.rescore``); ``NotFound`` for one past
        retention, ``InvalidTask`` naming the field for one that cannot be; under an
        ``idempotency_key``, once (``Conflict``, ``StillRunning``: ``Rescores``)."""
        return await self.rescores.rescore(request)

    async def aclose(self) -> None:
        """Cancel what runs apart from any request (the keyed re-scorings)."""
        await self.rescores.aclose()

    async def run(self, request: RunRequest) -> RunResponse:
        """Submit one task and wait (up to ``request.wait``) for its results."""
        (accepted,) = await self.submit(request.batch())
        await self.wait(accepted.rollout_ids, request.wait)
        view = await self.group(accepted.group_id)
        return RunResponse(**dict(view), results=[member.result for member in view.rollouts])

    def check_data_source(self, name: str) -> None:
        """Raise ``UnknownDataSource`` unless a handler serves ``name``."""
        try:
            self._engine.handler(name)
        except UnknownHandler as exc:
            raise UnknownDataSource("data_source", exc.message) from exc

    # --- reading --------------------------------------------------------------------------
    async def rollout(self, rollout_id: str, wait: float = 0.0) -> RolloutView:
        """Its state and, once stored, its result; ``wait``: seconds to wait for it to
        finish first. Raises ``NotFound``."""
        if wait > 0:
            await self.wait([rollout_id], wait)
        live = self._engine.live.get(rollout_id)
        if live is not None:
            return RolloutView(
                id=live.id, group_id=live.spec.group_id, status=live.status, done=False, seq=None, result=None
            )
        # Not in flight: finished (its result written before it left), or unknown.
        row = await self._store.rollout(rollout_id, fresh=False)
        if row is None:
            raise NotFound(f"no rollout {rollout_id!r} (unknown, or past retention)")
        return RolloutView(
            id=row.id,
            group_id=row.group_id,
            status=row.status,
            done=row.status in TERMINAL,
            seq=row.seq,
            result=row.result,
        )

    async def group(self, group_id: str, wait: float = 0.0, results: bool = True) -> GroupView:
        """The group's rollouts (with their results unless ``results`` is false);
        ``wait``: seconds to wait for all of them first. Raises ``NotFound``."""
        view = await self._group(group_id, results=False)
        if wait > 0 and not view.done:
            await self.wait([member.id for member in view.rollouts], wait)
        return await self._group(group_id, results) if results or wait > 0 else view

    async def _group(self, group_id: str, results: bool) -> GroupView:
        found = await self._store.group(group_id, results=results)
        if found is None:
            raise NotFound(f"no group {group_id!r} (unknown, or past retention)")
        group, rows = found
        rows.sort(key=lambda row: row.spec.sample_index)  # ids sort "-10" before "-2"
        stored = {o.id: o for o in await self._store.group_outcomes(group_id)}
        outcomes: list[Outcome] = []
        counts: dict[RolloutStatus, int] = {}
        for row in rows:
            live = self._engine.live.get(row.id)
            status = live.status if live is not None else row.status
            counts[status] = counts.get(status, 0) + 1
            known = stored.get(row.id)
            # Done once its result is stored: a rollout still in flight may already carry
            # its final status while cleanup runs and the result is written.
            if live is None and known is not None and row.seq is not None:
                outcomes.append(known)
            else:
                outcomes.append(Outcome(id=row.id, status=status, seq=None, usable=False, reward=None, masked=False))
        first = rows[0].spec if rows else None
        filtered = first is not None and first.filter_zero_variance
        verdict = judge(group.n, filtered, outcomes)
        members = [
            GroupMember(
                id=row.id,
                status=o.status,
                done=o.done,
                seq=o.seq,
                used=row.id in verdict.used,
                result=row.result if results and o.done else None,
            )
            for row, o in zip(rows, outcomes, strict=True)
        ]
        return GroupView(
            group_id=group.id,
            task_id=group.task_id,
            n=group.n,
            oversample=max(0, len(rows) - group.n),
            filter_zero_variance=filtered,
            done=all(m.done for m in members),
            usable=verdict.usable,
            reasons=verdict.reasons,
            counts=verdict.counts,
            status_counts=counts,
            rollouts=members,
        )

    async def results(self, after: int = 0, limit: int = 100, wait: float = 0.0, rescored: str = "any") -> ResultsPage:
        """Up to ``limit`` results after cursor position ``after``, in completion order;
        ``wait``: seconds to wait for one when there are none yet. ``rescored``: ``any``,
        ``false`` (no re-scored result: those with ``rescored_from``) or ``true`` (only
        those); the cursor moves past the ones left out."""
        deadline = time.monotonic() + wait
        cursor = after
        while True:
            found = await self._store.results_after(cursor, limit)
            if found:
                cursor = found[-1].seq if found[-1].seq is not None else cursor
            kept = [r for r in found if rescored == "any" or (r.rescored_from is not None) == (rescored == "true")]
            remaining = deadline - time.monotonic()
            if kept or remaining <= 0 or self.closing:
                break
            if not found:
                await self._engine.events.wait_change(remaining)
        return ResultsPage(results=kept, next=cursor)

    async def summaries(self, where: SummaryFilter, before: int | None = None, limit: int = 50) -> ResultSummaryPage:
        """A page of the finished results matching ``where``, newest first, from cursor
        position ``before`` down (None: from the newest)."""
        found, total = await self._store.summaries(where, before, limit + 1)
        page = found[:limit]
        more = len(found) > limit
        return ResultSummaryPage(
            summaries=page,
            total=min(total, COUNT_CAP),
            total_capped=total > COUNT_CAP,
            next_before=page[-1].seq if more else None,
        )

    async def finished(self, rollout_id: str) -> RolloutResult | None:
        """Its stored result, or None while it has none (in flight, or unknown)."""
        row = await self._store.rollout(rollout_id, fresh=False)  # (a result is written at once)
        return None if row is None else row.result

    async def wait(self, rollout_ids: list[str], timeout: float) -> None:
        """Wait (bounded by ``timeout`` seconds) until none of them is in flight."""
        await self._engine.wait_finished(rollout_ids, timeout)

    def total_timeout(self, rollout_id: str) -> float | None:
        """Seconds the rollout may take in all (the handler's default when the request
        set none); None when it is not in flight."""
        live = self._engine.live.get(rollout_id)
        return None if live is None else live.timeouts.total

    @asynccontextmanager
    async def events(self) -> AsyncIterator[asyncio.Queue[StateEvent]]:
        """A queue of every state change from now on, while the block runs."""
        queue = self._engine.events.subscribe()
        try:
            yield queue
        finally:
            self._engine.events.unsubscribe(queue)

    async def next_event(self, queue: asyncio.Queue[StateEvent], timeout: float | None) -> StateEvent | None:
        """The next event of an ``events()`` queue; None at the timeout (None: no bound)
        or once the service shuts down."""
        return await self._engine.events.next_event(queue, timeout)

    @property
    def closing(self) -> bool:
        """The service is shutting down: long-polls answer what they have now."""
        return self._engine.events.closing.is_set()

    async def until_closing(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the service to begin shutting down (True)."""
        return await self._engine.events.until_closing(timeout)

    def begin_shutdown(self) -> None:
        """End the long-polls and event streams now (the service is about to stop)."""
        self._engine.begin_shutdown()

    def status(self) -> EngineStatus:
        return self._engine.status()

    async def drain_node(self, name: str, draining: bool) -> list[NodeStatus]:
        """Stop (or resume) placing new rollouts on a cluster node; its own finish.
        Raises ``NotFound``."""
        try:
            return await self._engine.executor.drain(name, draining)
        except KeyError:
            where = (
                ""
                if self._engine.executor.nodes() is not None
                else (" (this server runs everything itself: nodes exist with --ray)")
            )
            raise NotFound(f"no node named {name!r}{where}") from None

    # --- cancelling ----------------------------------------------------------------------
    def stop(self, rollout_id: str) -> bool:
        """Cancel a rollout in flight without waiting (True), or nothing (False)."""
        return self._engine.cancel(rollout_id)

    async def cancel(self, rollout_id: str, wait: float = CANCEL_WAIT) -> CancelResponse:
        """Cancel a rollout in flight and wait (bounded) for its result. Raises
        ``NotFound``."""
        cancelled = self.stop(rollout_id)
        if cancelled:
            await self.wait([rollout_id], wait)
        view = await self.rollout(rollout_id)
        return CancelResponse(id=rollout_id, cancelled=cancelled, status=view.status)

    async def cancel_group(self, group_id: str, wait: float = CANCEL_WAIT) -> GroupCancelResponse:
        """Cancel the group's rollouts in flight and wait (bounded) for their results.
        Raises ``NotFound``."""
        view = await self._group(group_id, results=False)
        cancelled = [m.id for m in view.rollouts if self.stop(m.id)]
        await self.wait(cancelled, wait)
        return GroupCancelResponse(group_id=group_id, cancelled=cancelled)

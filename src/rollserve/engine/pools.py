"""Stage pools: a concurrency limit per stage with a FIFO queue in front of it; the
start gate that spreads a big batch's first steps over passes of the event loop.

A rollout holds a slot only while its stage runs and gives it back the moment the
stage ends, so a slow evaluation never holds a RUN slot. The queue in front of a
pool is bounded by the engine's admission limit (``max_pending``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rollserve.contract import StageStatus
from rollserve.llm.slots import FifoSlots


class StagePool:
    def __init__(self, name: str, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"{name}_workers must be at least 1, got {workers}")
        self.name = name
        self.workers = workers
        # FIFO; a waiter cancelled anywhere in a long queue leaves it in O(1) (a stop
        # cancels them all at once: ``llm.slots``)
        self._slots = FifoSlots(workers)
        self._shrunk = 0  # slots to take out of use as they come free (``resize``)
        self.waiting = 0
        self.busy = 0
        self.done = 0
        self.busy_seconds = 0.0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Wait for a free slot; yields the seconds spent queued."""
        queued_at = time.perf_counter()
        self.waiting += 1
        try:
            await self._slots.acquire()
            while self._shrunk:  # a slot the pool shrank by: out of use, wait for another
                self._shrunk -= 1
                await self._slots.acquire()
        finally:
            self.waiting -= 1
        started = time.perf_counter()
        self.busy += 1
        try:
            yield started - queued_at
        finally:
            self.busy -= 1
            self.done += 1
            self.busy_seconds += time.perf_counter() - started
            self._slots.release()

    def resize(self, workers: int) -> None:
        """Change the limit (at least 1); stages running over a smaller limit finish."""
        workers = max(1, workers)
        grown, self.workers = workers - self.workers, workers
        if grown < 0:
            self._shrunk -= grown
        for _ in range(grown):
            if self._shrunk:
                self._shrunk -= 1
            else:
                self._slots.release()

    def close(self) -> None:
        """The engine is stopping: no waiter gets a slot any more (each is cancelled),
        so a slot given back meanwhile starts no stage for a rollout about to stop."""
        self._slots.close()

    def snapshot(self) -> StageStatus:
        return StageStatus(
            workers=self.workers,
            busy=self.busy,
            queued=self.waiting,
            done=self.done,
            busy_seconds=round(self.busy_seconds, 3),
        )


class StartGate:
    """Lets at most ``per_pass`` new rollouts take their first steps per pass of the
    event loop, in the order they came.

    A batch of 4,000 rollouts, launched at once, would otherwise all run their first
    steps (INIT, the first prompt, the first call sent) in the same pass of the loop:
    seconds in which no request is answered. Through the gate they start in passes
    of ``per_pass``, and the loop reads its sockets between two passes. On the server's
    loop (``engine.priority``) the release, scheduled from a rollout, is itself the
    rollouts' work: it runs once a turn of their queue, in their slices."""

    def __init__(self, per_pass: int) -> None:
        if per_pass < 1:
            raise ValueError(f"per_pass must be at least 1, got {per_pass}")
        self.per_pass = per_pass
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def turn(self) -> None:
        """Wait for this rollout's turn to start (cancellable)."""
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._release)
        await turn

    def _release(self) -> None:
        released = 0
        while self._waiting and released < self.per_pass:
            turn = self._waiting.popleft()
            if not turn.done():  # (a cancelled waiter takes no turn)
                turn.set_result(None)
                released += 1
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._release)  # the next pass
        else:
            self._scheduled = False

"""A FIFO counting limit whose cancelled waiters cost O(1): ``FifoSlots``.

``asyncio.Semaphore`` removes a cancelled waiter from its queue with ``deque.remove``
(a walk from the front) and, at each release, walks past every waiter that is done but
not yet removed. A server stopping 65,000 rollouts cancels them all at once: the
futures of the tens of thousands queued for a connection are cancelled together, and
each of the ``max_connections`` slots given back walked all of them (at 65,000 held on
two backends of 512 connections, 33 million steps, a few seconds of the stop); a
waiter cancelled at the back of a long queue walked the whole queue to leave it.

Here a cancelled waiter stays in the queue, marked done, until a release pops it off
the front (each is popped once), or the queue is compacted when more than half of it
is such waiters (so a queue that no release reaches stays bounded by the live ones).
``close`` stops giving slots to anyone: a stop cancels every waiter, and a slot freed
meanwhile is not handed to a rollout about to be cancelled.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["FifoSlots"]


class _Waiter:
    __slots__ = ("future", "queued", "dropped")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.queued = True  # still in the queue
        self.dropped = False  # cancelled, and counted in ``_dropped`` while queued


class FifoSlots:
    """At most ``limit`` holders at once; the others wait in the order they came.
    Use ``acquire`` and ``release`` in pairs (a cancelled ``acquire`` holds nothing)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be at least 0, got {limit}")
        self._free = limit
        self._waiters: deque[_Waiter] = deque()
        self._dropped = 0  # cancelled waiters still in the queue
        self.closed = False

    @property
    def queued(self) -> int:
        """Entries in the queue, cancelled ones not yet popped included."""
        return len(self._waiters)

    async def acquire(self) -> None:
        # (free slots with live waiters cannot be: a release hands its slot to the first)
        if self._free > 0 and not self.closed:
            self._free -= 1
            return
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():  # given a slot, then cancelled
                self.release()  # pass it on
            elif waiter.queued:
                self._drop(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first live waiter, or to the free count."""
        if not self.closed:
            while self._waiters:
                waiter = self._waiters.popleft()
                waiter.queued = False
                if waiter.future.done():  # cancelled while queued
                    self._dropped -= waiter.dropped
                    continue
                waiter.future.set_result(None)
                return
        self._free += 1

    def close(self) -> None:
        """Give no more slots: waiters wait until cancelled, a slot given back is kept."""
        self.closed = True

    def _drop(self, waiter: _Waiter) -> None:
        waiter.dropped = True
        self._dropped += 1
        if self._dropped > 32 and 2 * self._dropped > len(self._waiters):  # compact: O(1) a drop, amortized
            kept: deque[_Waiter] = deque()
            for w in self._waiters:
                if w.future.done():
                    w.queued = False
                else:
                    kept.append(w)
            self._waiters = kept
            self._dropped = 0

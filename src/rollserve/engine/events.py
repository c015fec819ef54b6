"""Fan-out of rollout state changes: for long-polls and server-sent events."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from rollserve.contract import RolloutStatus, StateEvent


class EventBus:
    """Publishes state changes to subscribers; a slow subscriber loses old events,
    never blocks the engine (its queue is bounded and it is told it lagged)."""

    def __init__(self, subscriber_queue: int = 10_000, history: int = 1000):
        self._subscribers: set[asyncio.Queue[StateEvent]] = set()
        self._queue_size = subscriber_queue
        self.recent: deque[StateEvent] = deque(maxlen=history)
        self._changed = asyncio.Event()
        # Set when the service begins to shut down: long-polls and streams end now rather
        # than hold the HTTP server's graceful shutdown until its timeout.
        self.closing = asyncio.Event()

    def publish(
        self,
        rollout_id: str,
        group_id: str,
        status: RolloutStatus,
        reward: float | None = None,
        mask: bool | None = None,
        final: bool = False,
    ) -> None:
        """One state change; ``final``: the rollout ended (the event carries its reward
        and mask)."""
        if final:
            event = StateEvent(
                rollout_id=rollout_id, group_id=group_id, status=status, time=time.time(), reward=reward, mask=mask
            )
        else:
            event = StateEvent(rollout_id=rollout_id, group_id=group_id, status=status, time=time.time())
        self.recent.append(event)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
                queue.put_nowait(StateEvent(status="lagged", time=time.time()))
            else:
                queue.put_nowait(event)
        # Wake everyone waiting for "something changed", then arm a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    def subscribe(self) -> asyncio.Queue[StateEvent]:
        queue: asyncio.Queue[StateEvent] = asyncio.Queue(maxsize=self._queue_size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[StateEvent]) -> None:
        self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        """Queues subscribed now (an event stream holds one while it is open)."""
        return len(self._subscribers)

    def close(self) -> None:
        """The service is shutting down: every wait here returns, now and from now on."""
        self.closing.set()
        self._changed.set()

    async def next_event(self, queue: asyncio.Queue[StateEvent], timeout: float | None) -> StateEvent | None:
        """``queue``'s next event; None at the timeout (None: no bound) or once closing."""
        if not queue.empty():
            return queue.get_nowait()
        if self.closing.is_set():
            return None
        getting = asyncio.ensure_future(queue.get())
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait((getting, closing), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        return None

    async def until_closing(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the service to begin shutting down: True
        once it has."""
        try:
            async with asyncio.timeout(timeout):
                await self.closing.wait()
            return True
        except TimeoutError:
            return False

    async def wait_change(self, timeout: float) -> bool:
        """Wait until the next event (True) or the timeout (False); False at once while
        the service shuts down."""
        if self.closing.is_set():
            return False
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
                await self._changed.wait()
            return True
        except TimeoutError:
            return False

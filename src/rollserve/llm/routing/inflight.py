"""The requests the router has in flight: to abort them at a pause, and to wait for
them to finish (a pause in "finish" mode, a drain, a removal's grace period)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class InFlight:
    task: asyncio.Future
    aborted: bool = False  # cancelled by a pause: to be sent again after resume


class InFlightCalls:
    def __init__(self) -> None:
        self._calls: set[InFlight] = set()
        self._settled = asyncio.Event()  # set (and replaced) whenever a call ends

    def __len__(self) -> int:
        return len(self._calls)

    def start(self, task: asyncio.Future) -> InFlight:
        entry = InFlight(task)
        self._calls.add(entry)
        return entry

    def end(self, entry: InFlight) -> None:
        self._calls.discard(entry)
        self._settled.set()
        self._settled = asyncio.Event()

    def abort_all(self) -> int:
        """Cancel every call still running, marked as aborted; how many there were."""
        aborted = 0
        for entry in list(self._calls):
            if not entry.task.done():
                entry.aborted = True
                entry.task.cancel()
                aborted += 1
        return aborted

    async def wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (up to ``timeout``) until ``done()``, re-checked whenever a call ends."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not done():
            settled = self._settled
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            try:
                async with asyncio.timeout(left):  # not wait_for: it can swallow a cancel on 3.11
                    await settled.wait()
            except TimeoutError:
                return done()
        return True


def retrieve(task: asyncio.Future) -> None:
    """Read a dropped task's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()

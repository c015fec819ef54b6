"""What the sandbox caps' watchers share (diskcap.DiskWatch, shmcap.MemfdWatch): a
limit in bytes, the sandbox's host pids, what to do past the limit, and a polling
task started once and stopped (cancelled and awaited) when the sandbox closes."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Iterable

MB = 1 << 20


class CapWatch(abc.ABC):
    """Keeps something of one sandbox under ``limit`` bytes: ``on_exceeded(used)``
    kills the sandbox's processes (the runtime's way); ``pids()`` lists them."""

    def __init__(self, limit: int, pids: Callable[[], Iterable[int]],
                 on_exceeded: Callable[[int], Awaitable[None]]) -> None:
        self.limit = limit
        self._pids = pids
        self._on_exceeded = on_exceeded
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @abc.abstractmethod
    def notice(self, used: int) -> str:
        """What the killed processes' readers get at the end of their output."""

    @abc.abstractmethod
    async def check(self) -> int:
        """Measure now and enforce the cap; the usage in bytes."""

    @abc.abstractmethod
    async def _run(self) -> None:
        """Watch until cancelled (or the thing watched is gone)."""

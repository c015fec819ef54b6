"""What the sandbox caps' watchers share: a polling task started once and stopped
(cancelled and awaited) when the thing watched closes (``Poller``: these and
cpucap.CpuWatch); for diskcap.DiskWatch, shmcap.MemfdWatch and rsscap.ResidentWatch
also a limit in bytes, the sandbox's host pids and what to do past the limit
(``CapWatch``)."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Iterable

MB = 1 << 20


class Poller(abc.ABC):
    """A watching task: ``start()`` runs ``_run()`` once; ``stop()`` cancels it and
    waits for it to end."""

    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @abc.abstractmethod
    async def _run(self) -> None:
        """Watch until cancelled (or the thing watched is gone)."""


class CapWatch(Poller):
    """Keeps something of one sandbox under ``limit`` bytes: ``on_exceeded(used)``
    kills the sandbox's processes (the runtime's way); ``pids()`` lists them."""

    def __init__(
        self, limit: int, pids: Callable[[], Iterable[int]], on_exceeded: Callable[[int], Awaitable[None]]
    ) -> None:
        self.limit = limit
        self._pids = pids
        self._on_exceeded = on_exceeded

    @abc.abstractmethod
    def notice(self, used: int) -> str:
        """What the killed processes' readers get at the end of their output."""

    @abc.abstractmethod
    async def check(self) -> int:
        """Measure now and enforce the cap; the usage in bytes."""

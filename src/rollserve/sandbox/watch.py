"""What the sandbox caps' watchers share: a polling task started once and stopped
(cancelled and awaited) when the thing watched closes (``Poller``: these and
cpucap.CpuWatch); for diskcap.DiskWatch, shmcap.MemfdWatch and rsscap.ResidentWatch
also a limit in bytes, the sandbox's host pids and what to do past the limit
(``CapWatch``).

The disk and memfd watchers (``TickedWatch``) read something host-wide on every poll
(the filesystem's usage, /proc/meminfo's Shmem) and only now and then measure their
sandbox. With one task per watcher, 200 sandboxes meant 1,600 wake-ups and 1,600 of
those reads a second. Instead one ``Ticker`` per event loop and poll period wakes once
per period, makes each host-wide reading once (``readings``, shared by that tick's
watchers) and lets each watcher decide whether its sandbox is due for a measurement,
which then runs as a task of its own (one at a time per watcher). A watcher whose
sandbox holds no process (``active``: the runtime's say; bubblewrap's sandboxes hold
none between commands, a pooled one none at all) is skipped, after one last tick once
its last process has ended (``poke``): nothing in it can grow then.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

MB = 1 << 20
# The ticked watchers share one ticker per event loop (False: each runs a task of its
# own, the old way; benchmarks/tool_calls.py compares the two in one run).
SHARED_TICK = True


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


Readings = dict[Any, Any]  # one tick's host-wide readings, shared by its watchers


class TickedWatch(CapWatch):
    """A cap watcher driven by the shared ``Ticker`` of its poll ``period``: each tick
    ``due(now, readings)`` says whether to measure now (``check``, in a task of its own;
    the ticks in between are skipped). ``active()``: whether the sandbox may use what is
    watched now (None: always); after ``poke()`` one more tick runs even if not."""

    period: float = 0.25

    def __init__(
        self,
        limit: int,
        pids: Callable[[], Iterable[int]],
        on_exceeded: Callable[[int], Awaitable[None]],
        active: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(limit, pids, on_exceeded)
        self._active = active
        self._poked = False
        self._ticker: Ticker | None = None
        self._checking: asyncio.Task[None] | None = None
        self.ticks = 0  # ticks that made a reading (skipped ones not counted)

    @abc.abstractmethod
    def due(self, now: float, readings: Readings) -> bool:
        """Read what this tick needs (through ``readings``, once per tick for all) and
        say whether to measure now. ``FileNotFoundError``: the sandbox is gone."""

    async def _checked(self) -> None:
        """One measurement ``due`` asked for (overridden to note when it ran)."""
        await self.check()

    def start(self) -> None:
        if not SHARED_TICK:
            super().start()
        elif self._ticker is None:
            self._ticker = ticker(self.period)
            self._ticker.add(self)

    def poke(self) -> None:
        """Tick once more, active or not (the sandbox's last process just ended)."""
        self._poked = True

    def tick(self, now: float, readings: Readings) -> None:
        if self._checking is not None and not self._checking.done():
            return
        if not self._poked and self._active is not None and not self._active():
            return
        self._poked = False
        self.ticks += 1
        try:
            measure = self.due(now, readings)
        except FileNotFoundError:  # the folder went with the sandbox
            self._leave()
            return
        if measure:
            self._checking = asyncio.ensure_future(self._guarded())

    async def _guarded(self) -> None:
        try:
            await self._checked()
        except FileNotFoundError:
            self._leave()
        except Exception:  # never let one bad reading end the watching
            log.exception("%s check failed", type(self).__name__)

    def _leave(self) -> None:
        if self._ticker is not None:
            self._ticker.discard(self)

    async def stop(self) -> None:
        self._leave()
        self._ticker = None
        checking, self._checking = self._checking, None
        if checking is not None:
            checking.cancel()
            await asyncio.gather(checking, return_exceptions=True)
        await super().stop()

    async def _run(self) -> None:
        """The old way (``SHARED_TICK`` off): a task of its own, a reading of its own."""
        while True:
            try:
                if self.due(time.monotonic(), {}):
                    await self._checked()
            except FileNotFoundError:
                return
            except Exception:  # never let one bad reading end the watching
                log.exception("%s check failed", type(self).__name__)
            await asyncio.sleep(self.period)


class Ticker:
    """Every ``period`` seconds, ``tick(now, readings)`` of each watcher added, from
    one task (running while any watcher is added) with one ``readings`` per tick."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._watches: dict[TickedWatch, None] = {}  # (ordered: ticked in the order added)
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0  # ticks made

    def add(self, watch: TickedWatch) -> None:
        self._watches[watch] = None
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def discard(self, watch: TickedWatch) -> None:
        self._watches.pop(watch, None)

    def __len__(self) -> int:
        return len(self._watches)

    async def _run(self) -> None:
        while self._watches:
            await asyncio.sleep(self.period)
            now = time.monotonic()
            readings: Readings = {}
            self.rounds += 1
            for watch in list(self._watches):
                try:
                    watch.tick(now, readings)
                except Exception:  # one watcher's bug must not stop the others'
                    log.exception("%s tick failed", type(watch).__name__)


_tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Ticker]] = weakref.WeakKeyDictionary()


def ticker(period: float) -> Ticker:
    """The running event loop's ticker of ``period`` seconds."""
    per_loop = _tickers.setdefault(asyncio.get_running_loop(), {})
    if period not in per_loop:
        per_loop[period] = Ticker(period)
    return per_loop[period]

"""The CPU budget of one command: the CPU time of its whole process tree together.

RLIMIT_CPU (``SandboxLimits.cpu_seconds``) is per process: a command that forks
busy children spends it once per child, and a command that spins with less than it
holds a core until its wall timeout. ``CpuWatch`` bounds what one command (e.g. a
SWE test run) spends in all its processes together: every ``POLL`` seconds it reads
``/proc/PID/stat`` of the command's host process and all its descendants and, past
the budget, kills the command (its whole tree; ``ExecResult.cap == "cpu"``).

What it counts, as the largest of two lower bounds of the CPU the tree spent (each
sums disjoint slices of CPU time; the larger is kept, and the count never goes down):

- the live processes' own time (utime + stime, all their threads, exited threads
  included) plus what their reaped children spent (cutime + cstime: a child's time,
  with its own reaped children's, lands in its parent's when the parent waits for it;
  bwrap's first process reaps orphans in its PID namespace, so a double fork does not
  leave the count);
- the own time of every process ever seen, the last value seen of those gone.

Overshoot: between two readings the command can spend at most ``POLL`` seconds on
each core it runs on, and killing it takes one more reading's time: past the budget
by at most about (``POLL`` + the reading and the kill) x the cores it uses. A
process that lives less than ``POLL`` and is never waited for (its parent ignores
SIGCHLD, so the kernel reaps it and no cutime counts it) is not seen at all: each
such process is still bounded by RLIMIT_CPU and the command by its wall timeout.
Where the command's processes are not the host process's descendants (``docker exec``,
``podman exec``: the container's processes are the engine's), the budget sees only
the client and does not bound the command.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from rollserve.sandbox.proctree import stat_fields, tree_pids
from rollserve.sandbox.watch import Poller

log = logging.getLogger(__name__)

POLL = 0.5  # seconds between two readings of the tree
TICKS = os.sysconf("SC_CLK_TCK")


def stat_times(pid: int) -> tuple[tuple[int, int], float, float] | None:
    """((pid, start time), own CPU seconds, reaped children's CPU seconds) of ``pid``
    from ``/proc/PID/stat``; None once it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        start = int(fields[19])
    except (IndexError, ValueError):
        return None
    return (pid, start), (utime + stime) / TICKS, (cutime + cstime) / TICKS


class CpuWatch(Poller):
    """Keeps the CPU time of the process tree under ``root`` (a command's host
    process) within ``budget`` seconds; past it, ``on_exceeded(used)`` kills the
    command. ``used`` is the count so far (see the module's doc)."""

    def __init__(self, root: int, budget: float, on_exceeded: Callable[[float], Awaitable[None]]) -> None:
        self.root = root
        self.budget = budget
        self._on_exceeded = on_exceeded
        self.used = 0.0
        self.readings = 0
        self.exceeded = False
        self._own: dict[tuple[int, int], float] = {}  # every process seen: its last own time

    def notice(self, used: float) -> str:
        return (
            f"\n[rollserve: this command used {used:.1f} s of CPU time in all its "
            f"processes together, past its CPU budget of {self.budget:g} s; it was "
            "killed.]\n"
        )

    def measure(self) -> float:
        """Read the tree now; the count so far (never less than before)."""
        live = 0.0
        for pid in tree_pids([self.root]):
            times = stat_times(pid)
            if times is None:
                continue
            key, own, children = times
            self._own[key] = max(own, self._own.get(key, 0.0))
            live += own + children
        self.readings += 1
        self.used = max(self.used, live, sum(self._own.values()))
        return self.used

    async def check(self) -> float:
        """Measure now and enforce the budget (once); the count so far."""
        used = await asyncio.to_thread(self.measure)
        if used > self.budget and not self.exceeded:
            self.exceeded = True
            log.warning("a command used %.1f s of CPU, past its budget of %g s: killing it", used, self.budget)
            await self._on_exceeded(used)
        return used

    async def _run(self) -> None:
        while not self.exceeded:
            await asyncio.sleep(POLL)
            try:
                await self.check()
            except Exception:  # never let one bad reading end the watching
                log.exception("CPU budget check of process %d failed", self.root)

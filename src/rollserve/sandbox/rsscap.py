"""The resident-memory cap: what a sandbox's processes hold in RAM together stays near
``SandboxLimits.memory_mb``; past it, every process of the sandbox is killed
(``cap="memory"``). Used instead of ``RLIMIT_AS`` where a spec asks for it
(``memory_mode="resident"``: the harness runs) and no cgroup bounds the sandbox.

Why: ``RLIMIT_AS`` bounds the address space each process *reserves*, and JavaScript
runtimes reserve far more than they use (V8 reserves gigabytes for each WebAssembly
memory and its pointer cage, Bun's JavaScriptCore its Gigacage): under a 2 GiB
``RLIMIT_AS`` Claude Code (Bun) dies with "Illegal instruction" and Qwen Code (Node)
with "WebAssembly.instantiate(): Out of memory" while using a few hundred MB. This
cap counts what is resident, for the sandbox as a whole (RLIMIT_AS was per process:
N processes could hold N x the cap).

What it counts, each ``poll`` seconds (``FolderConfig.resident_poll``), in one pass
over the sandbox's processes:

- the sum of their resident set sizes plus their page tables (``VmRSS`` and ``VmPTE``
  of ``/proc/PID/status``: counters, tens of µs a process). Page tables count because
  RLIMIT_AS no longer bounds them: reading one byte every 2 MB of a huge reservation
  maps the shared zero page (no RSS) but a 4 KB page table each, 2 GB of kernel
  memory per TB reserved. RSS counts a page shared by several processes (a forked
  parent's copy-on-write pages, shared libraries, a shared mapping) once per
  process, so the sum can only over-count; while it is under the cap nothing more is
  read;
- over the cap, their proportional set sizes instead (``Pss`` of
  ``/proc/PID/smaps_rollup``, plus page tables): each resident page divided among the
  processes that map it, so a page the sandbox's processes share counts once, and the
  sum is what the sandbox holds. PSS walks the page tables (~11 ms per resident GB
  here), hence only past the cap. Not ``Private_*``: memory shared between two of the
  sandbox's processes (``MAP_SHARED`` after a fork) is private to neither, and would
  not count at all. A process whose ``smaps_rollup`` cannot be read counts its RSS.
  The largest are read first, the pass stops once the sum is past the cap, and it
  spends at most ``PSS_BUDGET`` seconds: the processes left count their RSS (an upper
  bound). So 256 processes sharing a parent's 2 GB copy-on-write (a 5 s walk here)
  cannot stretch the time between two readings, only be counted high.

A PSS pass is spaced from the last one by the time that one took (``pss_due``): a
sandbox that keeps its RSS sum past the cap while it holds less (many children sharing
a large mapping: 13 sharing 256 MB took 445 ms a pass on this loaded machine) would
otherwise make every poll one (76% of the watcher's wall time; 41% spaced:
``benchmarks/rss_overshoot.py --shared``); spaced, PSS takes at most about half of it,
whatever the sandbox does. The
polls in between read RSS alone and cannot kill (``how`` = "deferred"); a sandbox
really past the cap is killed by the next pass, so in that case the overshoot grows by
one pass's time. (Not skipping PSS until the RSS sum grew by the headroom the last pass
left: a process that unmaps its share of a shared mapping and maps as much private
memory keeps the RSS sum where it was while PSS grows, so that rule would never read
PSS again.)

Where the processes are found: the runtime's host processes (bwrap, whose PID
namespace's first process reaps every orphan of the sandbox, so nothing leaves the
tree) and their descendants (``proctree.tree_pids``: the ``children`` files, or a pass
over /proc where the kernel has none). Memory the sandbox holds outside its processes'
mappings is capped elsewhere, each on its own: memfd files (shmcap.py: under
``memory_mb`` too, so an unmapped memfd and resident memory may together reach twice
it), /dev/shm (a tmpfs of ``tmpfs_mb``), files (the disk cap). Kernel memory besides
page tables (pipes, sockets, thread stacks) is not counted, as RLIMIT_AS did not count
it either.

Found by running the real programs here in a bubblewrap sandbox at 2048 MB: under
RLIMIT_AS ``claude -p`` (Claude Code 2.1.197, Bun 1.4) dies of SIGILL (Bun's crash
report) while ``claude --version`` runs; with the resident cap both run.

Overshoot: between two readings the sandbox can allocate for ``poll`` seconds, and the
readings, the kill and the event loop's lag take more: past the cap by at most about
the allocation rate x the time from the start of the last reading under the cap to the
kill (``poll`` + two readings + the kill + the lag), plus one PSS pass's time where
PSS was deferred. Measured here (``benchmarks/rss_overshoot.py``) in docs/sandboxes.md
("Sandbox limits").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

from rollserve.sandbox.proctree import tree_pids
from rollserve.sandbox.watch import MB, CapWatch

log = logging.getLogger(__name__)

POLL = 0.1  # seconds between two readings (the default of FolderConfig.resident_poll)
PSS_BUDGET = 1.0  # seconds a reading may spend on PSS; the processes left count their RSS

MECHANISM = (
    "resident memory of all the sandbox's processes together (memory_mode "
    "'resident'): a watcher in the server sums their RSS and page tables from /proc "
    "every {poll:g} s "
    "(their PSS, shared pages once, when that sum passes the cap, no sooner after the "
    "last PSS pass than it took); past memory_mb "
    "every process of the sandbox is killed; overshoot about the allocation rate x "
    "({poll:g} s + the readings, the kill and the server's lag; + one PSS pass where "
    "deferred)"
)


def mechanism(poll: float) -> str:
    """How the resident cap is enforced, for ``Runtime.caps()``."""
    return MECHANISM.format(poll=poll)


def mode_caps(poll: float, bound: str | None = None, weaker: str = "") -> str:
    """What ``memory_mode`` does on a runtime (its ``caps()`` entry): nothing where
    ``bound`` (a cgroup) bounds the sandbox's memory, else either cap; ``weaker``:
    where the runtime's resident cap sees less."""
    if bound is not None:
        return f"no effect: {bound} bounds the sandbox's memory in either mode"
    return (
        "'address-space' (the default): RLIMIT_AS per process at memory_mb; 'resident' "
        f"(harness runs): no RLIMIT_AS, {mechanism(poll)}{weaker}"
    )


def rss_bytes(pid: int) -> tuple[int, int, int]:
    """(pid, resident set size, page tables) of ``pid``, in bytes (``VmRSS``, ``VmPTE``
    of ``/proc/PID/status``); 0 and 0 once it is gone (a zombie has neither)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
    except OSError:
        return pid, 0, 0
    return pid, _kb_field(text, b"\nVmRSS:"), _kb_field(text, b"\nVmPTE:")


def _kb_field(text: bytes, name: bytes) -> int:
    start = text.find(name)
    if start < 0:
        return 0
    try:
        return int(text[start + len(name) : text.index(b"kB", start)]) * 1024
    except ValueError:
        return 0


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of ``pid`` (``Pss`` of smaps_rollup); None where it
    cannot be read (gone, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_usage(roots: Iterable[int], limit: int, budget: float = PSS_BUDGET, pss: bool = True) -> tuple[int, str]:
    """(bytes, how) that the process trees under ``roots`` hold: the sum of their RSS
    (``how`` = "rss") while that is within ``limit``, else of their PSS ("pss"; RSS
    for a process whose PSS cannot be read), largest first, stopping once past
    ``limit`` (the rest can only add); page tables included either way. Processes not
    read within ``budget`` seconds count their RSS ("pss+rss"). Without ``pss``, past
    ``limit`` the RSS sum ("deferred": not what they hold, which may be less)."""
    sizes = sorted((rss_bytes(pid) for pid in tree_pids(roots)), key=lambda s: -(s[1] + s[2]))
    total = sum(rss + tables for _, rss, tables in sizes)
    if total <= limit:
        return total, "rss"
    if not pss:
        return total, "deferred"
    deadline = time.monotonic() + budget
    held = 0
    for index, (pid, rss, tables) in enumerate(sizes):
        if time.monotonic() > deadline:
            return held + sum(r + t for _, r, t in sizes[index:]), "pss+rss"
        proportional = pss_bytes(pid)
        held += (rss if proportional is None else proportional) + tables
        if held > limit:
            break
    return held, "pss"


class ResidentWatch(CapWatch):
    """Keeps the resident memory of one sandbox's processes under ``limit`` bytes
    together: every ``poll`` seconds it reads the trees under ``roots()`` (the
    runtime's host processes) and, past the limit, ``on_exceeded(used)`` kills them.
    A PSS pass comes no sooner after the last one than that one took (the module's
    doc); the readings in between that find the RSS sum past the limit are
    "deferred" and kill nothing."""

    def __init__(
        self,
        limit: int,
        roots: Callable[[], Iterable[int]],
        on_exceeded: Callable[[int], Awaitable[None]],
        poll: float = POLL,
    ) -> None:
        super().__init__(limit, roots, on_exceeded)
        self.poll = poll
        self.used = 0  # at the last reading
        self.how = "rss"  # what the last reading summed: "rss", "pss", "pss+rss", "deferred"
        self.counts: Counter[str] = Counter()  # readings so far, by how
        self.reading_seconds = 0.0  # how long the last reading took (in its thread)
        # Between the starts of the last two readings (poll, the reading, the loop's lag):
        # with reading_seconds and kill_seconds, what the overshoot scales with.
        self.gap_seconds = 0.0
        self.kill_seconds = 0.0  # how long the last kill took
        self.pss_due = 0.0  # (monotonic) no PSS pass before this: the last one's end + its time
        self._last_start: float | None = None
        self.kills = 0
        self.killed_at = 0  # the usage that made the last kill

    def notice(self, used: int) -> str:
        return (
            f"\n[rollserve: this sandbox reached its memory cap: its processes hold "
            f"{used / MB:.1f} MB resident together, the cap is {self.limit / MB:.0f} MB for "
            "the whole sandbox; every process in the sandbox was killed.]\n"
        )

    async def check(self) -> int:
        """Measure now and enforce the cap; the usage in bytes."""
        started = time.monotonic()
        if self._last_start is not None:
            self.gap_seconds = started - self._last_start
        self._last_start = started
        self.used, self.how = await asyncio.to_thread(
            resident_usage, list(self._pids()), self.limit, PSS_BUDGET, started >= self.pss_due
        )
        ended = time.monotonic()
        self.reading_seconds = ended - started
        self.counts[self.how] += 1
        if self.how.startswith("pss"):
            self.pss_due = ended + self.reading_seconds
        if self.used > self.limit and self.how != "deferred":
            self.kills += 1
            self.killed_at = self.used
            log.warning(
                "sandbox processes hold %d MB resident (%s), past the memory cap of %d MB: killing them",
                self.used // MB,
                self.how,
                self.limit // MB,
            )
            killing = time.monotonic()
            await self._on_exceeded(self.used)
            self.kill_seconds = time.monotonic() - killing
        return self.used

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            try:
                await self.check()
            except Exception:  # never let one bad reading end the watching
                log.exception("resident memory cap check failed")

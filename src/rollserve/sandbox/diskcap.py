"""The disk cap: what a sandbox's folders (/workspace and /tmp) hold together stays
near ``SandboxLimits.disk_mb``; past it, every process of the sandbox is killed.

Why a watcher in the server, and not a filesystem that is full at the cap: a quota
or a loop-mounted image needs root (and quotas a filesystem mounted for them), and a
size-capped tmpfs spends RAM and, since every command is its own bwrap, could not be
shared by a sandbox's commands without a long-lived namespace. The server may run as
a plain user on a Slurm node, on any filesystem; a watcher works there too, for every
runtime whose sandboxes are host folders (bubblewrap, apptainer, local; docker and
podman bind the same folders).

What it counts: the blocks allocated to everything under the sandbox's folder (hard
links once, the holes of sparse files not), plus files the sandbox's processes keep
open after deleting them (``/proc/PID/fd``; the classic way to hide a growing file
from a walk). A folder the sandbox closed to its owner is opened again (u+rx) to be
counted (a server that is not root owns the sandbox's files). Not counted: a deleted
file kept alive only by a memory mapping (each is still bounded by file_size_mb).

How it stays cheap: a walk costs ~10-16 µs a file (0.16 s for 10,000 files on CI), so
it does not run on a clock. Every ``POLL`` seconds the watcher reads how much of the
host filesystem under the folder is used (statvfs: a microsecond; one reading per tick
for every sandbox on that filesystem, watch.py's shared ticker, and none while the
sandbox holds no process); a sandbox cannot have grown more than that filesystem did.
A walk runs once the filesystem's growth since the last walk reaches half the
sandbox's headroom (the cap minus what it held), at most once per ``WALK_SHARE`` times
the last walk's duration (≤ 10 % of a core; a due walk waits no more than
``MAX_GAP``), and at least every ``SAFETY_WALK`` seconds (for growth that space freed
elsewhere at the same time hid).

At the cap, every process of the sandbox is killed, each with a notice at the end of
its output (stderr, or the PTY) that says why, and a command's ExecResult has
``cap="disk"``. Above the cap, nothing may grow: each growth kills again, while usage
that stays or shrinks does not, so the agent can delete files and go on. How far a
writer gets past the cap depends on how fast it writes: about its write rate times
(POLL + one walk), the headroom halving buys the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from rollserve.sandbox.watch import MB, Readings, TickedWatch

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between two reads of the host filesystem's usage
WALK_SHARE = 10  # a walk at most every WALK_SHARE x its own duration,
MAX_GAP = 5.0  # but never fewer than one every MAX_GAP seconds when one is due
SAFETY_WALK = 30.0  # seconds: a walk at least this often
MIN_TRIGGER = 64 << 10  # above the cap, any growth past this re-measures


MECHANISM = (
    "a watcher in the server: /workspace and /tmp (and deleted files still open) "
    "measured as the host filesystem grows; past the cap every process of the "
    "sandbox is killed"
)


def filesystem_used(folder: Path) -> int:
    """Bytes used on the filesystem that holds ``folder``."""
    st = os.statvfs(folder)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def folder_usage(folder: Path, pids: Iterable[int] = ()) -> int:
    """Bytes allocated under ``folder`` (hard links once, sparse holes not), plus the
    deleted files on the same filesystem that processes ``pids`` hold open."""
    device = os.lstat(folder).st_dev
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(folder)]
    while stack:
        path = stack.pop()
        entries = _open_folder(path)
        if entries is None:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if st.st_dev == device:  # (nothing is mounted in there; be sure)
                        stack.append(entry.path)
                elif st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += st.st_blocks * 512
    return total + deleted_open_files(pids, device, seen)


def _open_folder(path: str) -> os._ScandirIterator[str] | None:
    try:
        return os.scandir(path)
    except PermissionError:
        pass
    except OSError:
        return None
    # Closed by the sandbox (chmod 000): as a server that is not root we own it, so
    # open it again; root reads it anyway and never gets here.
    try:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | 0o500)
        return os.scandir(path)
    except OSError:
        return None


def _timed_usage(folder: Path, pids: list[int]) -> tuple[int, float]:
    started = time.monotonic()
    return folder_usage(folder, pids), time.monotonic() - started


def deleted_open_files(pids: Iterable[int], device: int, seen: set[tuple[int, int]] | None = None) -> int:
    """Bytes of deleted files on ``device`` that the processes ``pids`` hold open."""
    seen = set() if seen is None else seen
    total = 0
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # exited, or not ours to look at
            continue
        for fd in fds:
            try:
                if not os.readlink(f"{fd_dir}/{fd}").endswith(" (deleted)"):
                    continue
                st = os.stat(f"{fd_dir}/{fd}")  # follows to the open file itself
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if st.st_dev != device or not stat.S_ISREG(st.st_mode) or key in seen:
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total


class DiskWatch(TickedWatch):
    """Keeps one sandbox's folder under ``limit`` bytes: ``on_exceeded(used)`` kills
    the sandbox's processes (the runtime's way); ``pids()`` lists them, for deleted
    files they hold open; ``active()``: whether the sandbox may write now (None: always)."""

    period = POLL

    def __init__(
        self,
        folder: Path,
        limit: int,
        pids: Callable[[], Iterable[int]],
        on_exceeded: Callable[[int], Awaitable[None]],
        active: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(limit, pids, on_exceeded, active)
        self.folder = folder
        self._device: int | None = None  # the filesystem's, for the tick's shared reading
        self._growth = 0  # the filesystem's growth since the last walk
        self._previous: int | None = None  # its usage at the last reading
        self._last_walk = -float("inf")
        self.used: int | None = None  # at the last walk
        self.walks = 0
        self.walk_seconds = 0.0  # how long the last walk took (in its thread)
        self._killed_at: int | None = None  # usage when the cap last killed, while above it

    def notice(self, used: int) -> str:
        return (
            f"\n[rollserve: this sandbox reached its disk cap: /workspace and /tmp hold "
            f"{used / MB:.1f} MB, the cap is {self.limit / MB:.0f} MB; every process in "
            "the sandbox was killed. Delete files to go on.]\n"
        )

    async def check(self) -> int:
        """Measure now and enforce the cap; the usage in bytes."""
        pids = list(self._pids())
        used, self.walk_seconds = await asyncio.to_thread(_timed_usage, self.folder, pids)
        self.used = used
        self.walks += 1
        if used <= self.limit:
            self._killed_at = None
        elif self._killed_at is None or used > self._killed_at:
            log.warning(
                "sandbox folder %s holds %d MB, past its disk cap of %d MB: killing its processes",
                self.folder,
                used // MB,
                self.limit // MB,
            )
            await self._on_exceeded(used)  # returns once they are dead
            # What they wrote between the walk and their death is not growth to punish
            # the next command for: the mark is what is left once they are gone.
            settled, _ = await asyncio.to_thread(_timed_usage, self.folder, [])
            self._killed_at = self.used = max(used, settled)
        return used

    def _trigger(self) -> int:
        """Growth of the host filesystem after which this sandbox is measured again."""
        if self.used is None or self.used > self.limit:
            return MIN_TRIGGER
        return max(MIN_TRIGGER, (self.limit - self.used) // 2)

    def due(self, now: float, readings: Readings) -> bool:
        """Read the filesystem's usage (once per tick for every sandbox on it) and say
        whether the folder is due for a walk."""
        if self._device is None:
            self._device = os.stat(self.folder).st_dev
        key = ("filesystem_used", self._device)
        used = readings.get(key)
        if used is None:
            used = readings[key] = filesystem_used(self.folder)
        self._growth += max(0, used - (used if self._previous is None else self._previous))
        self._previous = used
        since = now - self._last_walk
        if since >= min(MAX_GAP, WALK_SHARE * self.walk_seconds) and (
            self._growth >= self._trigger() or since >= SAFETY_WALK
        ):
            self._growth, self._last_walk = 0, now
            return True
        return False

"""Per-sandbox cgroup v2 limits, where the host delegates a cgroup subtree to us.

A cgroup bounds the *whole sandbox* (all its processes together): memory.max (with
swap off), pids.max, and cgroup.kill to end everything at once. rlimits cannot do
that (RLIMIT_AS is per process). But cgroups need a writable, delegated cgroup v2
subtree with the memory and pids controllers enabled for children — e.g. a systemd
service with ``Delegate=yes`` whose own processes sit in a leaf. We never rearrange
the host's cgroups ourselves (moving the server's own process is not ours to do),
so the parent is either configured explicitly or found ready: marked delegated by
systemd, with memory and pids already enabled for its children.

On hosts with cgroup v1 only, or no delegation (this CI machine: v2 is mounted with
only the hugetlb controller), runtimes fall back to rlimits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rollserve.sandbox.base import SandboxLimits

NEEDED = {"memory", "pids"}


def cgroup2_mount() -> Path | None:
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split(" ")[4])
    except OSError:
        pass
    return None


def own_cgroup() -> Path | None:
    mount = cgroup2_mount()
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::") and mount is not None:
                return mount / line[3:].lstrip("/")
    except OSError:
        pass
    return None


def usable_parent(path: Path) -> str | None:
    """None if sandboxes' cgroups can be made under ``path``, else why not."""
    if not (path / "cgroup.subtree_control").exists():
        return f"{path}: not a cgroup v2 folder"
    enabled = controllers(path)
    if not NEEDED <= enabled:
        return f"{path}: controllers {sorted(NEEDED - enabled)} not enabled for children"
    if not os.access(path, os.W_OK):
        return f"{path}: not writable (not delegated to uid {os.geteuid()})"
    return None


def find_parent(configured: str | None) -> tuple[Path | None, str]:
    """(parent, reason): the cgroup under which sandboxes get theirs, or None and why."""
    if configured == "off":
        return None, "cgroups disabled in the configuration"
    if configured not in (None, "auto"):
        path = Path(configured)
        reason = usable_parent(path)
        return (None, reason) if reason else (path, "configured")
    own = own_cgroup()
    if own is None:
        return None, "no cgroup v2 hierarchy"
    # Our own cgroup holds our process, so (no internal processes) only its parent
    # may have controllers enabled for children. And a folder being writable is not
    # enough (root can write into systemd's slices, which are not ours): "auto" takes
    # only a folder systemd marked as delegated, or the real root of the hierarchy.
    for candidate in (own, own.parent):
        if usable_parent(candidate) is None and (delegated(candidate) or candidate == cgroup2_mount()):
            return candidate, "delegated"
    outer = own if own == cgroup2_mount() else own.parent
    return None, (
        usable_parent(outer)
        or f"{outer}: not marked as delegated (set BubblewrapConfig.cgroup to a folder delegated to rollserve)"
    )


def delegated(path: Path) -> bool:
    """systemd marks a cgroup it delegated (``Delegate=yes``) with an xattr."""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name) == b"1":
                return True
        except OSError:
            pass
    return False


def controllers(parent: Path) -> set[str]:
    """The controllers ``parent`` enables for its children."""
    try:
        return set((parent / "cgroup.subtree_control").read_text().split())
    except OSError:
        return set()


def create(parent: Path, name: str, limits: SandboxLimits, memory: bool = True) -> Path:
    """A sandbox's cgroup under ``parent``, with the limits of the controllers that
    ``parent`` enables (a parent chosen by ``find_parent`` enables memory and pids)."""
    enabled = controllers(parent)
    path = parent / name
    path.mkdir()
    if memory and "memory" in enabled:
        (path / "memory.max").write_text(str(limits.memory_mb << 20))
        try:
            (path / "memory.swap.max").write_text("0")  # no swapping past the limit
        except OSError:
            pass
    if "pids" in enabled:
        (path / "pids.max").write_text(str(limits.pids))
    return path


def add_process(path: Path, pid: int) -> None:
    (path / "cgroup.procs").write_text(str(pid))


def remove_cgroup(path: Path, timeout: float = 5.0) -> None:
    """Kill everything in the cgroup, then remove it."""
    if not path.exists():
        return
    kill = path / "cgroup.kill"
    if kill.exists():
        kill.write_text("1")
    else:  # kernels before 5.14: signal the member processes
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            # Busy until the killed processes are gone (microseconds to a few ms);
            # this runs at close and in the reaper, never on a hot path.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def memory_events(path: Path) -> dict[str, int]:
    """memory.events counters (``oom_kill`` tells that the memory limit killed)."""
    try:
        return {k: int(v) for k, v in (line.split() for line in (path / "memory.events").read_text().splitlines())}
    except (OSError, ValueError):
        return {}

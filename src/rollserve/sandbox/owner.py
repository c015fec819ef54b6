"""Owner records: which server owns which sandbox, so a restarted server reaps exactly
the sandboxes its dead predecessor left behind.

Every sandbox writes ``<state_dir>/sandboxes/<id>.json``: the owner (server pid and
process start time), the sandbox's host processes (pid and start time each), its
container or cgroup, and its folders. A pid alone is not an identity — pids are
reused — so a process is only ever signalled after its start time matched the
record. Nothing is ever found or killed by process name (on a shared node that kills
other users' jobs).

The reaper (reaper.py) reads these records at server start and asks the runtime
named in each dead owner's record to clean it up (``Runtime.reap(record)``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from pydantic import BaseModel, Field

# A process's identity is its pid plus its start time. The start time is read as
# the kernel keeps it — clock ticks since boot, which never change — together with
# the boot's id; an epoch time (boot time + ticks, what psutil reports) moves
# whenever the wall clock is adjusted (NTP steps the boot time by whole seconds), so
# it is kept for people reading the record and for records written before boot ids,
# where it is compared with a tolerance of a clock step.
EPOCH_TOLERANCE = 1.5
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class ProcessRef(BaseModel):
    pid: int
    started: float  # seconds since the epoch (informational: moves with the clock)
    since_boot: float | None = None  # start time in seconds since boot (exact)
    boot_id: str | None = None


def boot_id() -> str | None:
    try:
        return _BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def _since_boot(pid: int) -> float | None:
    """The process's start in seconds since boot, from /proc (field 22 of stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class OwnerRecord(BaseModel):
    sandbox_id: str
    runtime: str
    owner: ProcessRef
    processes: list[ProcessRef] = Field(default_factory=list)
    container: str | None = None  # container id or name
    engine: str | None = None  # the docker/podman binary that made the container
    engine_args: list[str] = Field(default_factory=list)  # e.g. podman's --runtime runc
    cgroup: str | None = None  # a cgroup v2 folder of this sandbox
    folders: list[str] = Field(default_factory=list)
    created: float = Field(default_factory=time.time)


def process_ref(pid: int) -> ProcessRef | None:
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return ProcessRef(pid=pid, started=started, since_boot=_since_boot(pid), boot_id=boot_id())


_SELF: ProcessRef | None = None


def this_process() -> ProcessRef:
    global _SELF
    if _SELF is None or _SELF.pid != os.getpid():  # (a forked child is another owner)
        _SELF = process_ref(os.getpid())
    assert _SELF is not None  # this very process
    return _SELF


def is_alive(ref: ProcessRef) -> bool:
    """The very process of the record still runs (same pid *and* start time)."""
    try:
        process = psutil.Process(ref.pid)
        if ref.since_boot is not None and ref.boot_id is not None:
            now = _since_boot(ref.pid)
            same = ref.boot_id == boot_id() and now is not None and abs(now - ref.since_boot) < 1e-6
        else:  # a record without boot-relative times
            same = abs(process.create_time() - ref.started) < EPOCH_TOLERANCE
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class OwnerBook:
    """The records of this server's sandboxes (``state_dir=None``: none are kept)."""

    def __init__(self, state_dir: Path | str | None):
        self.folder = Path(state_dir) / "sandboxes" if state_dir is not None else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def open(
        self,
        sandbox_id: str,
        runtime: str,
        folders: Sequence[Path],
        *,
        container: str | None = None,
        engine: str | None = None,
        engine_args: Sequence[str] = (),
        cgroup: str | None = None,
    ) -> OwnerEntry:
        record = OwnerRecord(
            sandbox_id=sandbox_id,
            runtime=runtime,
            owner=this_process(),
            folders=[str(f) for f in folders],
            container=container,
            engine=engine,
            engine_args=list(engine_args),
            cgroup=cgroup,
        )
        path = self.folder / f"{sandbox_id}.json" if self.folder is not None else None
        entry = OwnerEntry(record, path)
        entry.save()
        return entry


@dataclass
class OwnerEntry:
    record: OwnerRecord
    path: Path | None
    _refs: dict[int, ProcessRef] = field(default_factory=dict)

    def save(self) -> None:
        if self.path is None:
            return
        self.record.processes = list(self._refs.values())
        # Write-then-rename: a reaper never reads half a record. No fsync: records
        # guard against a dead server process, not a dead machine (which kills all).
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(self.record.model_dump_json())
        os.replace(tmp, self.path)

    def add(self, *pids: int) -> None:
        for pid in pids:
            if (ref := process_ref(pid)) is not None:
                self._refs[pid] = ref
        self.save()

    def discard(self, *pids: int) -> None:
        if any(self._refs.pop(pid, None) is not None for pid in pids):
            self.save()

    def delete(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


@dataclass
class Reaped:
    """What reaping one dead owner's sandbox did (``Runtime.reap``)."""

    killed: list[int] = field(default_factory=list)  # host pids killed
    errors: list[str] = field(default_factory=list)  # what could not be cleaned up


def kill_recorded(refs: list[ProcessRef]) -> list[int]:
    """SIGKILL the recorded processes that are still the same processes, their
    process groups (when they lead one) and their descendants."""
    victims: dict[int, psutil.Process] = {}
    for ref in refs:
        if not is_alive(ref):
            continue
        try:
            process = psutil.Process(ref.pid)
            victims[process.pid] = process
            for child in process.children(recursive=True):
                victims.setdefault(child.pid, child)
            if os.getpgid(ref.pid) == ref.pid:  # a group leader we started: its group
                os.killpg(ref.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    killed = []
    for process in victims.values():
        try:
            process.kill()  # psutil re-checks the start time before signalling
            killed.append(process.pid)
        except psutil.Error:
            pass
    _wait_gone(list(victims.values()), timeout=5)
    return killed


def _wait_gone(processes: list[psutil.Process], timeout: float) -> None:
    """Until each is gone or a zombie. (Orphans are reaped by init, not by us — and
    some container inits never reap, so a zombie counts as gone: it holds nothing.)"""
    deadline = time.monotonic() + timeout
    while processes and time.monotonic() < deadline:
        processes = [p for p in processes if _running(p)]
        if processes:
            time.sleep(0.01)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def remove_tree(path: Path) -> None:
    """rm -rf that also gets through folders the sandbox made read-only."""

    def make_writable(function: Callable[[str], object], name: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
            function(name)
        except OSError:
            pass

    if path.is_symlink():
        path.unlink()
    elif path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=make_writable)
        else:
            shutil.rmtree(path, onerror=make_writable)

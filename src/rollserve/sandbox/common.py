"""The template the folder runtimes (local, apptainer, docker/podman, bubblewrap) share.

Each of their sandboxes is a pair of host folders (``SandboxFolders``) with an owner
record (``OwnerEntry``) and a set of live host processes started over them.
``FolderRuntime`` holds what their runtimes do alike (state dir, owner book, reaping
a dead owner's sandbox); ``FolderSandbox`` is the one spawn/exec/close of their
sandboxes:

- ``spawn`` wraps a PTY command in ``setsid --ctty --wait`` (its own session with the
  PTY as controlling terminal: job control, and b"\\x03" interrupts the foreground
  job; ``--wait``: should setsid have to fork, the exit status still comes back);
- ``exec`` runs a command on pipes under ``bash -c`` and collects it (``host.collect``:
  capped output, killed at the timeout, 128+N read back as signal N);
- ``close`` kills every process, lets the runtime release what it holds (container,
  cgroup, uid), removes the folders (on a thread: a big workspace takes a while) and
  the owner record.

What a runtime adds is how a command becomes a host process (``_launch``: bwrap,
``apptainer exec``, ``docker exec``, or the command itself) and what it releases.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import (
    SERVER_DIR,
    WORKDIR,
    ConfigT,
    ExecResult,
    Runtime,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from rollserve.sandbox.cpucap import CpuWatch
from rollserve.sandbox.diskcap import MB, DiskWatch
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.host import collect
from rollserve.sandbox.owner import (
    OwnerBook,
    OwnerEntry,
    OwnerRecord,
    Reaped,
    kill_recorded,
    remove_tree,
)
from rollserve.sandbox.process import KILL_WAIT, HostProcess
from rollserve.sandbox.proctree import tree_pids
from rollserve.sandbox.rsscap import ResidentWatch

# A command on a PTY runs under this (see the module's doc); written here only.
CTTY = ("setsid", "--ctty", "--wait")


def shell_argv(command: str | list[str]) -> list[str]:
    """A command as argv: a string runs under ``bash -c``."""
    return ["bash", "-c", command] if isinstance(command, str) else list(command)


class FolderRuntime(Runtime[ConfigT]):
    """A runtime whose sandboxes are ``FolderSandbox``es."""

    def __init__(self, state_dir: Path | str | None, config: ConfigT) -> None:
        self.config = config
        self.name = config.runtime
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        self.book = OwnerBook(state_dir)

    def open_folders(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        root: Path | None,
        *,
        container: str | None = None,
        engine: str | None = None,
        engine_args: Sequence[str] = (),
    ) -> tuple[SandboxFolders, OwnerEntry]:
        """A new sandbox's folders (with the spec's files, and the empty folder its
        ``hide`` paths are covered with) and its owner record (with
        the container the runtime will make, if any); a failure is a SandboxError."""
        # The record first, naming what is about to be made: a server killed from here
        # on leaves a record the next one reaps (the reaper takes a missing folder).
        base = SandboxFolders.base_path(root, sandbox_id)
        try:
            entry = self.book.open(
                sandbox_id, self.name, [base], container=container, engine=engine, engine_args=engine_args
            )
        except OSError as error:
            raise SandboxError(f"{self.name} sandbox could not start: {error}") from error
        try:
            folders = SandboxFolders.create(root, sandbox_id)
            folders.write_files(spec)
            folders.make_own(spec.folders)
            if spec.hide:
                folders.make_empty()
        except (OSError, ValueError) as error:
            remove_tree(base)
            entry.delete()
            raise SandboxError(f"{self.name} sandbox could not start: {error}") from error
        return folders, entry

    @classmethod
    def reap(cls, record: OwnerRecord) -> Reaped:
        reaped = Reaped(killed=kill_recorded(record.processes))
        reaped.errors += cls.reap_resources(record)
        for folder in record.folders:
            remove_tree(Path(folder))
        return reaped

    @classmethod
    def reap_resources(cls, record: OwnerRecord) -> list[str]:
        """Remove what else a dead owner's sandbox holds (a container, a cgroup),
        after its processes and before its folders; what failed, as messages."""
        return []


class FolderSandbox(Sandbox):
    """A sandbox over ``SandboxFolders`` whose commands are host processes it tracks."""

    # Whether every process of the sandbox lives inside one of its launchers (bwrap's
    # PID namespace): with none of them running, nothing in it can write or hold
    # memory, so its cap watchers skip their ticks (watch.py). Not so where a command's
    # background jobs outlive it (a container's exec, a local process's own session).
    contains_processes = False

    def __init__(
        self,
        runtime: str,
        sandbox_id: str,
        spec: SandboxSpec,
        folders: SandboxFolders,
        entry: OwnerEntry,
        *,
        resident_poll: float | None = None,
        memory_bounded: bool = False,
    ) -> None:
        """``resident_poll``: where the runtime can cap resident memory (rsscap.py), its
        seconds between two readings; ``memory_bounded``: a cgroup bounds the sandbox's
        memory (then the spec's ``memory_mode`` changes nothing)."""
        self.id = sandbox_id
        self.runtime = runtime
        self.spec = spec
        self.folders = folders
        self.workspace = folders.workspace
        self._entry = entry
        self._processes: set[HostProcess] = set()
        self._recorded: dict[HostProcess, tuple[int, ...]] = {}  # their pids in the record
        self._closed = False
        self._seeding = False  # while True, commands see no workspace aliases
        self.disk: DiskWatch | None = None  # the disk cap's watcher, once started
        self.resident: ResidentWatch | None = None  # the resident memory cap's (rsscap.py)
        # Where this sandbox gets that cap: the seconds between its readings, else None.
        self.resident_poll = (
            resident_poll
            if resident_poll is not None and rl.resident_cap(spec.limits, bounded=memory_bounded)
            else None
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        """Open, and its workspace and tmp folders are still there (something on the
        host, a /tmp cleaner or an operator, may remove them from a sandbox no process
        holds open, such as a pooled one)."""
        return not self._closed and self.folders.workspace.is_dir() and self.folders.tmp.is_dir()

    def server_folder(self) -> tuple[Path, str] | None:
        """``folders.server``, bound read-only at ``SERVER_DIR`` by the runtimes that
        bind folders (bubblewrap, apptainer, docker/podman)."""
        return self.folders.server, SERVER_DIR

    # -- what each runtime says -------------------------------------------------------

    @abc.abstractmethod
    async def _launch(
        self, inner: list[str], *, pty: bool, env: dict[str, str] | None, merge_stderr: bool
    ) -> HostProcess:
        """Start ``inner`` (argv as the sandbox runs it, already wrapped for a PTY) as
        a host process, counted as the sandbox's (``_track``)."""

    async def _release(self) -> None:
        """Release what the runtime holds for this sandbox besides its processes and
        folders (a container, a cgroup, a uid); called once, by ``close``."""

    # -- the template -------------------------------------------------------------------

    async def spawn(
        self, argv: list[str], pty: bool = False, env: dict[str, str] | None = None, *, merge_stderr: bool = True
    ) -> HostProcess:
        self._check_open()
        inner = [*CTTY, *argv] if pty else list(argv)
        return await self._launch(inner, pty=pty, env=env, merge_stderr=merge_stderr)

    async def exec(
        self,
        command: str | list[str],
        timeout: float,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 1 << 20,
        *,
        cpu_budget: float | None = None,
    ) -> ExecResult:
        return await self._collect(shell_argv(command), timeout, stdin, env, max_output, cpu_budget)

    async def _collect(
        self,
        inner: list[str],
        timeout: float,
        stdin: bytes | None,
        env: dict[str, str] | None,
        max_output: int,
        cpu_budget: float | None = None,
    ) -> ExecResult:
        """Run ``inner`` on pipes (stderr apart) to its end or ``timeout`` (or, with
        ``cpu_budget``, until its process tree has used that much CPU: cpucap.py)."""
        started = time.monotonic()
        self._check_open()
        process = await self._launch(inner, pty=False, env=env, merge_stderr=False)
        watch = None
        if cpu_budget is not None:
            watch = CpuWatch(process.pid, cpu_budget, lambda used: self._cpu_exceeded(process, watch, used))
            watch.start()
        try:
            # Launchers (bwrap, bash, setsid) exit 128+N when the command dies of signal N.
            return await collect(process, timeout, stdin, max_output, signal_codes=True, started=started)
        finally:
            if watch is not None:
                await watch.stop()

    async def _cpu_exceeded(self, process: HostProcess, watch: CpuWatch | None, used: float) -> None:
        """Kill a command past its CPU budget (the sandbox stays open)."""
        if watch is not None:
            process.kill_for_cap("cpu", watch.notice(used))
            await process.wait(KILL_WAIT)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_caps()
        processes = list(self._processes)
        outcomes = await asyncio.gather(*(process.kill() for process in processes), return_exceptions=True)
        try:
            await self._release()
        finally:
            await asyncio.to_thread(remove_tree, self.folders.base)
            self._entry.delete()
        stuck = [
            f"{process.pid}: {outcome}"
            for process, outcome in zip(processes, outcomes)
            if isinstance(outcome, BaseException)
        ]
        if stuck:
            raise SandboxError(f"sandbox {self.id}: processes that would not die: {'; '.join(stuck)}")

    # -- bookkeeping --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    def _start_host(
        self,
        argv: list[str],
        *,
        pty: bool,
        env: dict[str, str],
        merge_stderr: bool,
        cwd: Path | None = None,
        new_session: bool = True,
    ) -> HostProcess:
        """Start ``argv`` on the host and track it; an OSError is a SandboxError."""
        try:
            process = HostProcess.start(
                argv, pty=pty, env=env, cwd=cwd, merge_stderr=merge_stderr, new_session=new_session
            )
        except OSError as error:
            raise SandboxError(f"sandbox {self.id}: cannot start {argv[0]}: {error}") from error
        return self._track(process)

    def _track(self, process: HostProcess) -> HostProcess:
        """Count ``process`` as the sandbox's (here and in the owner record) until it exits."""
        self._processes.add(process)
        self._recorded[process] = (process.pid,)
        self._entry.add(process.pid)
        process.on_exit(self._forget)
        return process

    def _record(self, process: HostProcess, *pids: int) -> None:
        """Put more pids of a tracked process in the owner record (bwrap's child)."""
        if process in self._processes:
            self._recorded[process] += pids
            self._entry.add(*pids)

    def _forget(self, process: HostProcess) -> None:
        self._processes.discard(process)
        self._entry.discard(*self._recorded.pop(process, ()))
        if self.disk is not None and not self._processes:
            self.disk.poke()  # one more reading: what its last process wrote

    # -- caps and seeding ---------------------------------------------------------------

    def start_caps(self) -> None:
        """Start watching the disk cap (workspace and tmp together: the sandbox's
        folder) and, where the sandbox gets one (``resident_poll``), the resident
        memory cap; the runtime calls it once the sandbox exists, before seeding it."""
        self.disk = DiskWatch(
            self.folders.base, self.spec.limits.disk_mb * MB, self.host_pids, self._disk_exceeded, self.caps_active()
        )
        self.disk.start()
        if self.resident_poll is not None:
            self.resident = ResidentWatch(
                self.spec.limits.memory_mb * MB, self.root_pids, self._resident_exceeded, self.resident_poll
            )
            self.resident.start()

    async def _stop_caps(self) -> None:
        for watch in (self.disk, self.resident):
            if watch is not None:
                await watch.stop()

    def caps_active(self) -> Callable[[], bool] | None:
        """What tells the cap watchers the sandbox holds a process now (None: they
        always count it as holding some; see ``contains_processes``)."""
        return (lambda: bool(self._processes)) if self.contains_processes else None

    def host_pids(self) -> list[int]:
        """Host pids of the sandbox's live processes and everything they started."""
        return tree_pids(self.root_pids())

    def root_pids(self) -> list[int]:
        """Host pids of the sandbox's live processes (the runtime's launchers)."""
        return [process.pid for process in list(self._processes)]

    async def _resident_exceeded(self, used: int) -> None:
        if self.resident is not None:
            await self.kill_for_cap("memory", self.resident.notice(used))

    async def _disk_exceeded(self, used: int) -> None:
        if self.disk is not None:
            await self.kill_for_cap("disk", self.disk.notice(used))

    async def kill_for_cap(self, cap: str, notice: str) -> None:
        """Kill every process of the sandbox because it passed ``cap`` and wait (bounded)
        for them to die; each one's reader gets ``notice`` at the end of its output.
        The sandbox stays open."""
        processes = list(self._processes)
        for process in processes:
            process.kill_for_cap(cap, notice)
        await asyncio.gather(*(process.wait(KILL_WAIT) for process in processes))

    def workspace_aliases(self) -> list[str]:
        """Where else the workspace is mounted in the command being built."""
        return [] if self._seeding else list(self.spec.workspace_aliases)

    async def seed(self) -> None:
        """Fill the workspace from ``spec.workspace_seed`` (one command run without the
        aliases, which would hide the seed); closes the sandbox and raises SandboxError
        if that fails."""
        seed = self.spec.workspace_seed
        if seed is None:
            return
        self._seeding = True
        try:
            result = await self.exec(
                ["cp", "-a", f"{seed}/.", f"{WORKDIR}/"], timeout=max(self.spec.start_timeout, 300.0)
            )
        finally:
            self._seeding = False
        if not result.ok:
            await self.close()
            raise SandboxError(f"sandbox {self.id}: could not copy {seed} into the workspace: {result.failure()}")

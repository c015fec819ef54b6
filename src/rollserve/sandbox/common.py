"""What the folder-based runtimes (local, apptainer, docker/podman, bubblewrap) share.

Each of their sandboxes is a pair of host folders (``SandboxFolders``) with an owner
record (``OwnerEntry``) and a set of live host processes started over them:
``open_folders`` makes the folders and the record when a runtime starts one, and
``FolderSandbox`` holds the bookkeeping every such sandbox does the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil

from rollserve.sandbox.base import WORKDIR, Sandbox, SandboxError, SandboxProcess, SandboxSpec
from rollserve.sandbox.diskcap import MB, DiskWatch
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.owner import OwnerBook, OwnerEntry
from rollserve.sandbox.process import KILL_WAIT, HostProcess


def shell_argv(command: str | list[str]) -> list[str]:
    """A command as argv: a string runs under ``bash -c``."""
    return ["bash", "-c", command] if isinstance(command, str) else list(command)


def open_folders(book: OwnerBook, runtime: str, label: str, root: Path | None,
                 sandbox_id: str, spec: SandboxSpec,
                 **record) -> tuple[SandboxFolders, OwnerEntry]:
    """A new sandbox's folders (with the spec's files) and its owner record; a
    failure is a SandboxError naming ``label``."""
    try:
        folders = SandboxFolders.create(root, sandbox_id)
        folders.write_files(spec)
        entry = book.open(sandbox_id, runtime, [folders.base], **record)
    except (OSError, ValueError) as error:
        raise SandboxError(f"{label} sandbox could not start: {error}") from error
    return folders, entry


class FolderSandbox(Sandbox):
    """A sandbox over ``SandboxFolders`` whose commands are host processes it tracks."""

    def _setup(self, sandbox_id: str, spec: SandboxSpec, folders: SandboxFolders,
               entry: OwnerEntry) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.folders = folders
        self.workspace = folders.workspace
        self._entry = entry
        self._processes: set[HostProcess] = set()
        self._closed = False
        self._seeding = False  # while True, commands see no workspace aliases
        self.disk: DiskWatch | None = None  # the disk cap's watcher, once started

    def start_caps(self) -> None:
        """Start watching the disk cap (workspace and tmp together: the sandbox's
        folder); the runtime calls it once the sandbox exists, before seeding it."""
        self.disk = DiskWatch(self.folders.base, self.spec.limits.disk_mb * MB,
                              self.host_pids, self._disk_exceeded)
        self.disk.start()

    def host_pids(self) -> list[int]:
        """Host pids of the sandbox's live processes and everything they started."""
        pids = []
        for process in list(self._processes):
            try:
                pids += [process.pid, *(child.pid for child in
                                        psutil.Process(process.pid).children(recursive=True))]
            except psutil.Error:
                continue
        return pids

    async def _disk_exceeded(self, used: int) -> None:
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
            result = await self.exec(["cp", "-a", f"{seed}/.", f"{WORKDIR}/"],
                                     timeout=max(self.spec.start_timeout, 300.0))
        finally:
            self._seeding = False
        if not result.ok:
            await self.close()
            raise SandboxError(f"sandbox {self.id}: could not copy {seed} into the workspace: "
                               f"{result.failure()}")

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    def _start_host(self, argv: list[str], **options) -> HostProcess:
        """``HostProcess.start(argv, **options)``; an OSError is a SandboxError."""
        try:
            return HostProcess.start(argv, **options)
        except OSError as error:
            raise SandboxError(f"sandbox {self.id}: cannot start {argv[0]}: {error}") from error

    def _track(self, process: HostProcess) -> HostProcess:
        """Count ``process`` as the sandbox's (here and in the owner record) until it exits."""
        self._processes.add(process)
        self._entry.add(process.pid)
        process.on_exit(self._forget)
        return process

    def _forget(self, process: HostProcess) -> None:
        self._processes.discard(process)
        self._entry.discard(process.pid)

    def _start(self, argv: list[str], pty: bool, env: dict[str, str] | None,
               merge_stderr: bool) -> HostProcess:
        raise NotImplementedError

    async def spawn(self, argv: list[str], pty: bool = False, env: dict[str, str] | None = None,
                    *, merge_stderr: bool = True) -> SandboxProcess:
        return self._start(list(argv), pty=pty, env=env, merge_stderr=merge_stderr)

    async def _begin_close(self) -> bool:
        """Mark the sandbox closed and kill its processes; False if it was closed already."""
        if self._closed:
            return False
        self._closed = True
        await self._stop_caps()
        for process in list(self._processes):
            await process.kill()
        return True

    async def _stop_caps(self) -> None:
        if self.disk is not None:
            await self.disk.stop()

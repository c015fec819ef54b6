"""The ``local`` runtime: commands run directly on the host. NO ISOLATION.

For development and tests on machines without bubblewrap only: a command can read
and write anything the server can, reach the network, and see every process. What
it does give: a fresh temp workspace per sandbox (cwd), a private TMPDIR (also HOME), a
clean environment (the server's variables — tokens — are not passed on), rlimits on
memory, file size, CPU time and open files, and every process in its own process
group, killed (with its descendants) when the sandbox closes.

There is no ``/workspace`` here: commands see the real host path (``$PWD``), so
scripts should use relative paths. The process limit is not enforced (RLIMIT_NPROC
would count all of the server user's processes; see limits.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import (ExecResult, Runtime, Sandbox, SandboxError,
                                    SandboxProcess, SandboxSpec)
from rollserve.sandbox.folders import SandboxFolders, new_sandbox_id
from rollserve.sandbox.owner import OwnerBook, OwnerEntry, remove_tree
from rollserve.sandbox.process import HostProcess, collect

log = logging.getLogger(__name__)


class LocalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    root: Path | None = None  # where sandbox folders go (None: the system temp folder)


def base_env(home: str, tmp: str, spec: SandboxSpec, extra: dict[str, str] | None,
             pty: bool, path: str) -> dict[str, str]:
    """A clean environment: nothing of the server's leaks in."""
    env = {"PATH": path, "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if pty:
        env["TERM"] = "xterm"
    env.update(spec.env)
    env.update(extra or {})
    return env


class LocalRuntime(Runtime):
    name = "local"

    def __init__(self, state_dir: Path | str | None = None, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        self.book = OwnerBook(state_dir)
        log.warning(
            "\n%s\n!! sandbox runtime 'local': NO ISOLATION. Agent commands run on this host\n"
            "!! with the server's user and permissions, network and files. Development only.\n%s",
            "!" * 78, "!" * 78)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    async def start(self, spec: SandboxSpec) -> "LocalSandbox":
        if spec.image is not None:
            log.warning("local runtime ignores image %r: commands run on the host", spec.image)
        sandbox_id = new_sandbox_id(self.name)
        try:
            folders = SandboxFolders.create(self.config.root, sandbox_id)
            folders.write_files(spec)
            entry = self.book.open(sandbox_id, self.name, [folders.base])
        except (OSError, ValueError) as error:
            raise SandboxError(f"local sandbox could not start: {error}") from error
        return LocalSandbox(sandbox_id, spec, folders, entry)


class LocalSandbox(Sandbox):
    runtime = "local"

    def __init__(self, sandbox_id: str, spec: SandboxSpec, folders: SandboxFolders,
                 entry: OwnerEntry):
        self.id = sandbox_id
        self.spec = spec
        self.folders = folders
        self.workspace = folders.workspace
        self._entry = entry
        self._limits = rl.prlimit_argv(rl.rlimits(spec.limits, nproc=False))
        self._processes: set[HostProcess] = set()
        self._closed = False

    def _start(self, argv: list[str], pty: bool, env: dict[str, str] | None,
               merge_stderr: bool) -> HostProcess:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        # HOME is the private tmp folder (caches and dotfiles stay out of the workspace).
        env = base_env(str(self.folders.tmp), str(self.folders.tmp), self.spec, env, pty,
                       os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
        if pty:
            # `setsid --ctty`: its own session with the PTY as controlling terminal, so
            # bash gets job control and b"\x03" on the PTY interrupts the foreground
            # job. Not started in a new session by us, else setsid would fork.
            argv = [*self._limits, "setsid", "--ctty", "--wait", *argv]
        else:
            argv = [*self._limits, *argv]
        try:
            process = HostProcess.start(argv, pty=pty, env=env, cwd=self.workspace,
                                        merge_stderr=merge_stderr, new_session=not pty)
        except OSError as error:
            raise SandboxError(f"sandbox {self.id}: cannot start {argv[0]}: {error}") from error
        self._processes.add(process)
        self._entry.add(process.pid)
        process.on_exit(self._forget)
        return process

    def _forget(self, process: HostProcess) -> None:
        self._processes.discard(process)
        self._entry.discard(process.pid)

    async def exec(self, command: str | list[str], timeout: float, stdin: bytes | None = None,
                   env: dict[str, str] | None = None, max_output: int = 1 << 20) -> ExecResult:
        started = time.monotonic()
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        process = self._start(argv, pty=False, env=env, merge_stderr=False)
        try:
            # (128+N: killed by signal N, as bash and bwrap report it; as in bubblewrap)
            return await collect(process, timeout, stdin, max_output, signal_codes=True,
                                 started=started)
        finally:
            self._forget(process)

    async def spawn(self, argv: list[str], pty: bool = False, env: dict[str, str] | None = None,
                    *, merge_stderr: bool = True) -> SandboxProcess:
        return self._start(list(argv), pty=pty, env=env, merge_stderr=merge_stderr)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for process in list(self._processes):
            try:
                await process.kill()
            finally:
                self._forget(process)
        remove_tree(self.folders.base)
        self._entry.delete()

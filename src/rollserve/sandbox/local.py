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

from rollserve.sandbox import diskcap
from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import ExecResult, SandboxError, Runtime, SandboxSpec
from rollserve.sandbox.common import FolderSandbox, open_folders, shell_argv
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

    def caps(self) -> dict[str, str]:
        return {"memory_mb": rl.MEMORY_PER_PROCESS, "pids": "NOT enforced (local runtime)",
                **rl.PER_PROCESS, "disk_mb": diskcap.MECHANISM,
                "tmpfs_mb": "NOT enforced (local runtime: the host's /dev/shm)"}

    async def start(self, spec: SandboxSpec) -> "LocalSandbox":
        if spec.image is not None:
            log.warning("local runtime ignores image %r: commands run on the host", spec.image)
        if spec.workspace_aliases or spec.workspace_seed:
            raise SandboxError("local runtime: workspace_aliases and workspace_seed need a "
                               "mount namespace; use bubblewrap (or apptainer)")
        sandbox_id = new_sandbox_id(self.name)
        folders, entry = open_folders(self.book, self.name, "local", self.config.root,
                                      sandbox_id, spec)
        sandbox = LocalSandbox(sandbox_id, spec, folders, entry)
        sandbox.start_caps()
        return sandbox


class LocalSandbox(FolderSandbox):
    runtime = "local"

    def __init__(self, sandbox_id: str, spec: SandboxSpec, folders: SandboxFolders,
                 entry: OwnerEntry):
        self._setup(sandbox_id, spec, folders, entry)
        self._limits = rl.prlimit_argv(rl.rlimits(spec.limits, nproc=False))

    def _start(self, argv: list[str], pty: bool, env: dict[str, str] | None,
               merge_stderr: bool) -> HostProcess:
        self._check_open()
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
        return self._track(self._start_host(argv, pty=pty, env=env, cwd=self.workspace,
                                            merge_stderr=merge_stderr, new_session=not pty))

    async def exec(self, command: str | list[str], timeout: float, stdin: bytes | None = None,
                   env: dict[str, str] | None = None, max_output: int = 1 << 20) -> ExecResult:
        started = time.monotonic()
        process = self._start(shell_argv(command), pty=False, env=env, merge_stderr=False)
        try:
            # (128+N: killed by signal N, as bash and bwrap report it; as in bubblewrap)
            return await collect(process, timeout, stdin, max_output, signal_codes=True,
                                 started=started)
        finally:
            self._forget(process)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_caps()
        for process in list(self._processes):
            try:
                await process.kill()
            finally:
                self._forget(process)
        remove_tree(self.folders.base)
        self._entry.delete()

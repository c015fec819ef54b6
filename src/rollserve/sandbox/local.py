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
from pathlib import Path

from rollserve.sandbox import diskcap, rsscap
from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import SandboxError, SandboxSpec, paths_problem
from rollserve.sandbox.common import FolderRuntime, FolderSandbox
from rollserve.sandbox.config import LocalConfig
from rollserve.sandbox.folders import SandboxFolders, new_sandbox_id
from rollserve.sandbox.owner import OwnerEntry
from rollserve.sandbox.process import HostProcess

__all__ = ["LocalConfig", "LocalRuntime", "LocalSandbox", "base_env"]

log = logging.getLogger(__name__)


def base_env(
    home: str, tmp: str, spec: SandboxSpec, extra: dict[str, str] | None, pty: bool, path: str
) -> dict[str, str]:
    """A clean environment: nothing of the server's leaks in."""
    env = {
        "PATH": path,
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if pty:
        env["TERM"] = "xterm"
    env.update(spec.env)
    env.update(extra or {})
    return env


class LocalRuntime(FolderRuntime[LocalConfig]):
    name = "local"
    config_model = LocalConfig
    own_paths = False  # (commands see the host's paths: no /workspace, no private /tmp)

    def __init__(self, state_dir: Path | str | None = None, config: LocalConfig | None = None) -> None:
        super().__init__(state_dir, config or LocalConfig())
        log.warning(
            "\n%s\n!! sandbox runtime 'local': NO ISOLATION. Agent commands run on this host\n"
            "!! with the server's user and permissions, network and files. Development only.\n%s",
            "!" * 78,
            "!" * 78,
        )

    @classmethod
    def unavailable_reason(cls, config: LocalConfig | None = None) -> str | None:
        return None

    def caps(self) -> dict[str, str]:
        return {
            "memory_mb": rl.MEMORY_PER_PROCESS,
            "memory_mode": rsscap.mode_caps(
                self.config.resident_poll,
                weaker=" (processes that leave the command's "
                "tree, e.g. a daemon's double fork, are not seen: no PID namespace)",
            ),
            "pids": "NOT enforced (local runtime)",
            **rl.PER_PROCESS,
            "disk_mb": diskcap.MECHANISM,
            "tmpfs_mb": "NOT enforced (local runtime: the host's /dev/shm)",
        }

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        if spec.image is not None:
            log.warning("local runtime ignores image %r: commands run on the host", spec.image)
        problem = paths_problem(self.name, spec)
        if problem is not None:
            raise SandboxError(problem)
        sandbox_id = new_sandbox_id(self.name)
        folders, entry = self.open_folders(sandbox_id, spec, self.config.root)
        sandbox = LocalSandbox(self.name, sandbox_id, spec, folders, entry, self.config.resident_poll)
        sandbox.start_caps()
        return sandbox


class LocalSandbox(FolderSandbox):
    def __init__(
        self,
        runtime: str,
        sandbox_id: str,
        spec: SandboxSpec,
        folders: SandboxFolders,
        entry: OwnerEntry,
        resident_poll: float,
    ) -> None:
        super().__init__(runtime, sandbox_id, spec, folders, entry, resident_poll=resident_poll)
        self._limits = rl.prlimit_argv(rl.rlimits(spec.limits, nproc=False))

    def server_folder(self) -> tuple[Path, str] | None:
        """The host folder itself: nothing is mounted here (and nothing is isolated)."""
        return self.folders.server, str(self.folders.server)

    async def _launch(
        self, inner: list[str], *, pty: bool, env: dict[str, str] | None, merge_stderr: bool
    ) -> HostProcess:
        # HOME is the private tmp folder (caches and dotfiles stay out of the workspace).
        values = base_env(
            str(self.folders.tmp),
            str(self.folders.tmp),
            self.spec,
            env,
            pty,
            os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        )
        # On a PTY the command is `setsid --ctty ...`, our direct child: not started in a
        # new session by us, else setsid would fork.
        return self._start_host(
            [*self._limits, *inner],
            pty=pty,
            env=values,
            merge_stderr=merge_stderr,
            cwd=self.workspace,
            new_session=not pty,
        )

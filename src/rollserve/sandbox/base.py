"""The sandbox contract: a Runtime starts Sandboxes from a SandboxSpec.

A sandbox is a confined place to act: a writable workspace (a host folder bound at
``/workspace`` inside), a private /tmp, the environment the spec asks for, and
limits. Everything started in it — one-shot commands, persistent shells on a PTY,
interpreters — shares that workspace and those limits, and dies when the sandbox
closes (or when the server dies: die-with-parent, process groups, owner records).

Where a sandbox is deployed (the runtime: bubblewrap, apptainer, docker/podman,
local) is separate from what runs inside it (the tools in ``sandbox/tools``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.errors import InfraError

WORKDIR = "/workspace"
# Top-level paths a workspace alias may not take.
RESERVED = frozenset({"workspace", "tmp", "proc", "dev", "sys", "usr", "bin", "lib", "lib64",
                      "sbin", "etc", "run", "root", "home", "var", "boot"})


class SandboxError(InfraError):
    """A sandbox could not start, or its runtime failed under it (masked, never scored)."""


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(2048, ge=16, description="cgroup memory per sandbox where a cgroup "
                           "is available, else address space per process")
    pids: int = Field(256, ge=8, description="processes (RLIMIT_NPROC where no cgroup)")
    file_size_mb: int = Field(512, ge=1, description="largest file a process may write")
    cpu_seconds: int = Field(600, ge=1, description="CPU time per process")
    open_files: int = Field(1024, ge=16)
    disk_mb: int = Field(4096, ge=1, description="what /workspace and /tmp hold together; "
                         "past it every process of the sandbox is killed (see diskcap.py)")
    tmpfs_mb: int = Field(64, ge=1, description="size of each in-memory filesystem inside "
                          "(/dev/shm): writes past it fail with ENOSPC")


class SandboxSpec(BaseModel):
    """What a sandbox should be; every runtime reads the same spec."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(
        None,
        description="bubblewrap: a rootfs folder (None: the host root, read-only); "
        "apptainer: a .sif file or docker:// reference; docker/podman: an image",
    )
    files: dict[str, str] = Field(default_factory=dict, description="workspace path -> text")
    env: dict[str, str] = Field(default_factory=dict)
    network: bool = False
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    start_timeout: float = Field(60.0, gt=0, description="seconds to start, then SandboxError")
    workspace_aliases: list[str] = Field(
        default_factory=list,
        description="more top-level paths where the workspace is also mounted, e.g. "
        "['/testbed'] so an image's scripts and editable installs find the repository "
        "(apptainer, bubblewrap, docker/podman)")
    workspace_seed: str | None = Field(
        None, description="a folder of the image (or of the root) whose contents fill the "
        "workspace when the sandbox starts, before the aliases hide it, e.g. '/testbed' "
        "(apptainer, bubblewrap, docker/podman)")
    hide: list[str] = Field(
        default_factory=list,
        description="host folders this sandbox must not see, covered by an empty read-only "
        "tmpfs where the host root is shown (bubblewrap), e.g. the swe handler's mirrors "
        "(their history goes past the task's commit) and its bundled answers")

    @field_validator("workspace_aliases")
    @classmethod
    def _top_level_paths(cls, aliases: list[str]) -> list[str]:
        for alias in aliases:
            name = alias.strip("/")
            if not alias.startswith("/") or not name or "/" in name or name in RESERVED:
                raise ValueError(f"{alias!r}: an alias must be a top-level path like "
                                 f"/testbed, not one of /{', /'.join(sorted(RESERVED))}")
        return aliases

    @field_validator("workspace_seed")
    @classmethod
    def _absolute(cls, seed: str | None) -> str | None:
        if seed is not None and (not seed.startswith("/") or ".." in seed.split("/")):
            raise ValueError(f"{seed!r}: the seed must be an absolute path without '..'")
        return seed

    @field_validator("hide")
    @classmethod
    def _absolute_folders(cls, folders: list[str]) -> list[str]:
        for folder in folders:
            if not folder.startswith("/") or ".." in folder.split("/"):
                raise ValueError(f"{folder!r}: a hidden folder must be an absolute path without '..'")
        return folders


@dataclass
class ExecResult:
    exit_code: int | None  # None: killed at the timeout or by a signal
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0
    # The signal that ended the command (exit_code is then None): SIGKILL at a
    # memory/cgroup limit, SIGXCPU at the CPU limit, SIGXFSZ at the file-size limit.
    # bwrap reports a signalled child as exit status 128+N; it is read back as N.
    signal: int | None = None
    # The sandbox cap that killed the command ("disk", "memory"), None otherwise; the
    # reason is also at the end of its stderr, for the agent to read.
    cap: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def failure(self, limit: int = 500) -> str:
        """Why the command did not succeed, for an error message: ``timed out``, else
        the tail of its stderr (or stdout), else how it ended."""
        if self.timed_out:
            return "timed out"
        text = (self.stderr or self.stdout).strip()
        if text:
            return text[-limit:]
        return f"killed by signal {self.signal}" if self.signal else f"exit {self.exit_code}"


class SandboxProcess(abc.ABC):
    """A process running inside a sandbox, with pipes or a PTY to talk to it."""

    pid: int  # host pid of the process (or of the runtime's launcher) for signalling

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def read(self, max_bytes: int = 65536) -> bytes:
        """Next chunk of output as soon as there is any; b"" at end of output."""

    @abc.abstractmethod
    def signal(self, signum: int) -> None:
        """Send a signal to the process's whole process group."""

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> int | None: ...

    @property
    @abc.abstractmethod
    def returncode(self) -> int | None:
        """Exit status once it has exited (negative: killed by that signal), else None."""

    @abc.abstractmethod
    def kill_now(self) -> None:
        """SIGKILL the process and everything it started, without waiting: for
        ``finally`` blocks of cancelled tasks, where nothing can be awaited."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Kill the process group and reap it; idempotent."""

    def signal_foreground(self, signum: int) -> bool:
        """On a PTY: signal the terminal's foreground job (not the shell's own group).
        True if a group was signalled; False where the runtime cannot tell."""
        return False


class Sandbox(abc.ABC):
    id: str
    runtime: str
    workspace: Path  # the host folder seen inside as /workspace
    spec: SandboxSpec

    @abc.abstractmethod
    async def exec(
        self,
        command: str | list[str],
        timeout: float,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 1 << 20,
    ) -> ExecResult:
        """Run a one-shot command (a string runs under ``bash -c``); killed at ``timeout``."""

    @abc.abstractmethod
    async def spawn(
        self, argv: list[str], pty: bool = False, env: dict[str, str] | None = None,
        *, merge_stderr: bool = True,
    ) -> SandboxProcess:
        """Start a long-lived process (a shell on a PTY, an interpreter on pipes).

        On a PTY the process is a session leader with the PTY as its controlling
        terminal (job control: writing b"\\x03" interrupts the foreground job). On
        pipes, stderr is merged into stdout unless ``merge_stderr=False``; then the
        returned process also has ``read_stderr()``."""

    async def read_file(self, path: str) -> bytes:
        return resolve_in_workspace(self.workspace, path).read_bytes()

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = resolve_in_workspace(self.workspace, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill everything in the sandbox, remove its workspace and owner record; idempotent."""

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Runtime(abc.ABC):
    name: str

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this runtime can run here, else why not (for errors and test skips)."""

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox: ...

    def caps(self) -> dict[str, str]:
        """How this runtime enforces each SandboxLimits field, here: field -> mechanism
        (shown by ``GET /v1/status`` under ``sandboxes.limits``)."""
        return {}


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The host path for ``path`` (relative, or absolute under /workspace), refusing
    anything that leaves the workspace, through ``..`` or through a symlink."""
    root = workspace.resolve()
    relative = path[len(WORKDIR):].lstrip("/") if path.startswith(WORKDIR) else path
    if relative.startswith("/"):
        raise PermissionError(f"{path}: only paths inside {WORKDIR} are allowed")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise PermissionError(f"{path}: resolves outside {WORKDIR}")
    return target

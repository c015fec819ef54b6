"""The sandbox contract: a Runtime starts Sandboxes from a SandboxSpec.

A sandbox is a confined place to act: a writable workspace (a host folder bound at
``/workspace`` inside), a private /tmp, the environment the spec asks for, and
limits. Everything started in it — one-shot commands, persistent shells on a PTY,
interpreters — shares that workspace and those limits, and dies when the sandbox
closes (or when the server dies: die-with-parent, process groups, owner records).

Where a sandbox is deployed (the runtime: bubblewrap, apptainer, docker/podman,
local) is separate from what runs inside it (the tools in ``sandbox/tools``).

This module is the one home of the layer's contracts: ``Runtime`` (its name, config
model, ``unavailable_reason``, ``start``, ``caps``, ``reap(record)``), ``ImageRuntime``
(a runtime that fetches images ahead of time), ``Sandbox``, ``SandboxProcess``,
``SandboxSpec`` / ``SandboxLimits`` and ``SandboxStarter`` (what handlers start
sandboxes from). The runtimes are registered in registry.py, configured by the
tagged union in config.py; the folder runtimes share common.py's template.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, Literal, Protocol, Self, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.errors import InfraError
from rollserve.sandbox.owner import OwnerRecord, Reaped

WORKDIR = "/workspace"
# A folder only the server writes, shown read-only inside (the gateway's socket).
SERVER_DIR = "/.rollserve"
# Top-level paths a workspace alias may not take.
RESERVED = frozenset(
    {
        "workspace",
        "tmp",
        "proc",
        "dev",
        "sys",
        "usr",
        "bin",
        "lib",
        "lib64",
        "sbin",
        "etc",
        "run",
        "root",
        "home",
        "var",
        "boot",
        SERVER_DIR[1:],
    }
)


class SandboxError(InfraError):
    """A sandbox could not start, or its runtime failed under it (masked, never scored)."""


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(
        2048,
        ge=16,
        description="cgroup memory per sandbox where a cgroup "
        "is available, else (memory_mode) address space per process or "
        "resident memory per sandbox",
    )
    memory_mode: Literal["address-space", "resident"] = Field(
        "address-space",
        description="where no cgroup bounds the sandbox: 'address-space' "
        "caps each process's address space at memory_mb (RLIMIT_AS: an allocation past it "
        "fails); 'resident' caps what all the sandbox's processes hold in RAM together (a "
        "watcher kills them all past it: rsscap.py), for programs that reserve far more "
        "than they use (Node, Bun: the agent harnesses)",
    )
    pids: int = Field(256, ge=8, description="processes (RLIMIT_NPROC where no cgroup)")
    file_size_mb: int = Field(512, ge=1, description="largest file a process may write")
    cpu_seconds: int = Field(600, ge=1, description="CPU time per process")
    open_files: int = Field(1024, ge=16)
    disk_mb: int = Field(
        4096,
        ge=1,
        description="what /workspace and /tmp hold together; "
        "past it every process of the sandbox is killed (see diskcap.py)",
    )
    tmpfs_mb: int = Field(
        64, ge=1, description="size of each in-memory filesystem inside (/dev/shm): writes past it fail with ENOSPC"
    )


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
        "(apptainer, bubblewrap, docker/podman)",
    )
    workspace_seed: str | None = Field(
        None,
        description="a folder of the image (or of the root) whose contents fill the "
        "workspace when the sandbox starts, before the aliases hide it, e.g. '/testbed' "
        "(apptainer, bubblewrap, docker/podman)",
    )
    folders: list[str] = Field(
        default_factory=list,
        description="more top-level paths, each a writable folder of the sandbox's own (empty "
        "at start, not the workspace, not shown in it), e.g. Harbor's /tests and /logs "
        "(apptainer, bubblewrap, docker/podman)",
    )
    hide: list[str] = Field(
        default_factory=list,
        description="folders this sandbox must not see, each covered by an empty read-only "
        "folder: bubblewrap (a tmpfs, where the host root is shown), apptainer and "
        "docker/podman (a bind of an empty folder, over the image's path, e.g. R2E's "
        "/r2e_tests); the local runtime cannot hide anything. E.g. the swe handler's "
        "mirrors (their history goes past the task's commit) and its bundled answers",
    )

    readonly_binds: dict[str, str] = Field(
        default_factory=dict,
        description="inside path -> host folder, shown read-only inside (a harness's install "
        "folder); the inside path is a new top-level folder, e.g. /.rollserve-harness "
        "(apptainer, bubblewrap, docker/podman; the local runtime refuses any)",
    )

    @field_validator("readonly_binds")
    @classmethod
    def _bind_paths(cls, binds: dict[str, str]) -> dict[str, str]:
        for inside, host in binds.items():
            name = inside.strip("/")
            if not inside.startswith("/") or not name or "/" in name or name in RESERVED:
                raise ValueError(
                    f"{inside!r}: a read-only bind goes at a new top-level path, "
                    f"not one of /{', /'.join(sorted(RESERVED))}"
                )
            if not host.startswith("/") or ".." in host.split("/"):
                raise ValueError(f"{host!r}: the host folder must be an absolute path without '..'")
        return binds

    @field_validator("workspace_aliases", "folders")
    @classmethod
    def _top_level_paths(cls, aliases: list[str]) -> list[str]:
        for alias in aliases:
            name = alias.strip("/")
            if not alias.startswith("/") or not name or "/" in name or name in RESERVED:
                raise ValueError(
                    f"{alias!r}: an alias must be a top-level path like "
                    f"/testbed, not one of /{', /'.join(sorted(RESERVED))}"
                )
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
    # The sandbox cap that killed the command ("disk", "memory", "cpu": the command's
    # cpu_budget), None otherwise; the reason is also at the end of its stderr, for the
    # agent to read.
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
    cap: str | None = None  # the sandbox cap that killed it ("disk", "memory"), else None

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send ``data`` to its stdin (or PTY); BrokenPipeError once that is closed."""

    @abc.abstractmethod
    async def read(self, max_bytes: int = 65536) -> bytes:
        """Next chunk of output as soon as there is any; b"" at end of output."""

    @abc.abstractmethod
    async def read_stderr(self, max_bytes: int = 65536) -> bytes:
        """Next chunk of stderr, when spawned with ``merge_stderr=False`` (else b"")."""

    @abc.abstractmethod
    def close_stdin(self) -> None:
        """End of input for a pipe process (a PTY has no separate stdin to close)."""

    @abc.abstractmethod
    def signal(self, signum: int) -> None:
        """Send a signal to the process's whole process group."""

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it exits, or None if it still runs after ``timeout``."""

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
        """Kill the process group and reap it, then ``close``; idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close our ends of its pipes or PTY (the process itself is not touched):
        pending reads return b"", writes raise BrokenPipeError; idempotent."""

    @abc.abstractmethod
    def signal_foreground(self, signum: int) -> bool:
        """On a PTY: signal the terminal's foreground job (not the shell's own group).
        True if a group was signalled; False on pipes or where the runtime cannot tell."""


class Sandbox(abc.ABC):
    """One confined place to act (see the module's doc); started by a ``Runtime``."""

    id: str
    runtime: str  # the name of the runtime that started it
    workspace: Path  # the host folder seen inside as /workspace
    spec: SandboxSpec
    # A Python the runtime made for its sandboxes, seen inside at this prefix (its
    # bin/python, its site-packages: never the server's; sandbox_python.py); None
    # where the runtime made none (an image brings its own).
    python_prefix: str | None = None
    # Why the runtime has no Python of the sandboxes' own, where it should (said in the
    # error of whatever then finds no python inside).
    python_error: str | None = None

    @abc.abstractmethod
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
        """Run a one-shot command (a string runs under ``bash -c``); killed at ``timeout``,
        or, with ``cpu_budget``, once all its processes together have used that many CPU
        seconds (then ``cap="cpu"``; see cpucap.py for what is counted, and where not)."""

    @abc.abstractmethod
    async def spawn(
        self,
        argv: list[str],
        pty: bool = False,
        env: dict[str, str] | None = None,
        *,
        merge_stderr: bool = True,
    ) -> SandboxProcess:
        """Start a long-lived process (a shell on a PTY, an interpreter on pipes).

        On a PTY the process is a session leader with the PTY as its controlling
        terminal (job control: writing b"\\x03" interrupts the foreground job). On
        pipes, stderr is merged into stdout unless ``merge_stderr=False``; then it is
        read with ``read_stderr()``."""

    def server_folder(self) -> tuple[Path, str] | None:
        """A folder only the server writes, seen read-only inside (nothing in the sandbox
        can add, remove or replace what is in it): its host path and its path inside;
        None where this sandbox has none."""
        return None

    async def read_file(self, path: str) -> bytes:
        """A workspace file's bytes (``path`` relative, or absolute under /workspace)."""
        return resolve_in_workspace(self.workspace, path).read_bytes()

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a workspace file (its folders made), as the sandbox's user can change it."""
        target = resolve_in_workspace(self.workspace, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once ``close`` has begun: nothing more can be started in it."""

    def alive(self) -> bool:
        """Whether it can still be used, as far as a check of microseconds (no command
        run) tells: not closed, and what the runtime can look at cheaply is still there
        (a warm pool asks before it hands out a sandbox that waited idle)."""
        return not self.closed

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill everything in the sandbox, remove its workspace and owner record; idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RuntimeConfigBase(BaseModel):
    """A runtime's settings (``--sandbox-options``), tagged by ``runtime``: one model
    per runtime class, the name it is registered under in ``runtime`` (config.py has
    them all, as one tagged union)."""

    model_config = ConfigDict(extra="forbid")

    runtime: str

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The runtime names this model configures: the values its ``runtime`` tag takes."""
        return tuple(str(name) for name in get_args(cls.model_fields["runtime"].annotation))


ConfigT = TypeVar("ConfigT", bound=RuntimeConfigBase)


class BadImageReference(ValueError):
    """An image reference a runtime can never fetch (no retry helps)."""


class Runtime(abc.ABC, Generic[ConfigT]):
    """Starts sandboxes of one kind (bubblewrap, apptainer, docker/podman, local).

    Registered by name in registry.py under each name its ``config_model`` takes;
    built with its state dir (owner records go under it) and its config. ``reap`` is
    a class method: a restarted server cleans up its dead predecessor's sandboxes
    without making their runtime (which may not even be its own)."""

    name: str  # the name it runs as (apptainer: the binary found, apptainer or singularity)
    config_model: ClassVar[type[RuntimeConfigBase]]
    # Its sandboxes see paths of their own: the workspace at /workspace, a private /tmp,
    # and what a spec adds (readonly_binds, workspace_aliases, workspace_seed, folders).
    # False (the local runtime): commands see the host's own paths, and a spec asking
    # for any of those is refused (``paths_problem``).
    own_paths: ClassVar[bool] = True
    config: ConfigT
    state_dir: Path | None  # where its sandboxes' owner records go (None: nowhere)

    @abc.abstractmethod
    def __init__(self, state_dir: Path | str | None = None, config: ConfigT | None = None) -> None: ...

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls, config: ConfigT | None = None) -> str | None:
        """None when this runtime (so configured) can run here, else why not, saying
        what to install (for errors and test skips)."""

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """A new sandbox as ``spec`` says; SandboxError if it cannot start."""

    @abc.abstractmethod
    def caps(self) -> dict[str, str]:
        """How this runtime enforces each SandboxLimits field, here: field -> mechanism
        (shown by ``GET /v1/status`` under ``sandboxes.limits``)."""

    @classmethod
    @abc.abstractmethod
    def reap(cls, record: OwnerRecord) -> Reaped:
        """Clean up a sandbox of this runtime whose owner died (its processes, what
        else it made, its folders), as its owner record says. Blocking: call it from a
        thread."""


class ImageRuntime(Runtime[ConfigT]):
    """A runtime whose sandboxes start from images it can fetch ahead of time
    (``rollserve images pull``) into the place its sandboxes look for them."""

    @classmethod
    @abc.abstractmethod
    def for_pulling(cls, config: ConfigT, image_cache: Path, concurrency: int, timeout: float) -> Self:
        """This runtime made to fetch images: at most ``concurrency`` at once (where it
        bounds them itself), ``timeout`` seconds each, into ``image_cache`` where it
        keeps its own images (else into the engine's store)."""

    @abc.abstractmethod
    def images_unavailable_reason(self) -> str | None:
        """None if images can be fetched here, else why not (what to install)."""

    @abc.abstractmethod
    def image_reference(self, reference: str) -> str:
        """``reference`` as this runtime fetches it; BadImageReference if it cannot."""

    @abc.abstractmethod
    def image_location(self) -> Path | None:
        """Where fetched images go: a folder, or None for the engine's own store."""

    @abc.abstractmethod
    async def image_cached(self, reference: str) -> bool:
        """The image is there already (BadImageReference: it never will be)."""

    @abc.abstractmethod
    async def pull_image(self, reference: str) -> None:
        """Fetch the image; SandboxError (or OSError, TimeoutError) if this attempt failed."""


class SandboxStarter(Protocol):
    """What handlers start sandboxes from (``HandlerContext.sandboxes``): a ``Runtime``,
    or the server's ``registry.LazyRuntime`` that makes its runtime on first use."""

    @property
    def name(self) -> str:
        """The runtime's name (bubblewrap, apptainer, docker...)."""
        ...

    @property
    def own_paths(self) -> bool:
        """Whether its sandboxes see paths of their own: /workspace, a private /tmp,
        read-only binds (False: the local runtime, on the host's paths)."""
        ...

    async def start(self, spec: SandboxSpec) -> Sandbox: ...


def paths_problem(runtime: str, spec: SandboxSpec) -> str | None:
    """Why a runtime without paths of its own (``Runtime.own_paths`` False) cannot
    start ``spec``, if it asks for a path only a mount namespace gives."""
    asked = [
        name for name in ("workspace_aliases", "workspace_seed", "folders", "readonly_binds") if getattr(spec, name)
    ]
    if not asked:
        return None
    return (
        f"{runtime} runtime: {', '.join(asked)} need a mount namespace (paths of the "
        "sandbox's own); use bubblewrap (or apptainer, docker, podman)"
    )


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The host path for ``path`` (relative, or absolute under /workspace), refusing
    anything that leaves the workspace, through ``..`` or through a symlink."""
    root = workspace.resolve()
    relative = path[len(WORKDIR) :].lstrip("/") if path.startswith(WORKDIR) else path
    if relative.startswith("/"):
        raise PermissionError(f"{path}: only paths inside {WORKDIR} are allowed")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise PermissionError(f"{path}: resolves outside {WORKDIR}")
    return target

"""The ``apptainer`` runtime (also ``singularity``): rootless HPC containers from .sif images.

HPC clusters rarely allow Docker; Apptainer runs unprivileged, from a single .sif
file. A spec's image is a ``.sif`` path or a reference Apptainer can build from
(``docker://python:3.12-slim``, ``oras://...``, ``library://...``). References are
built once into an image cache (``ImageCache``): the file name is a hash of the
reference, builds are capped (a semaphore), a lock per reference makes concurrent
rollouts that need one image wait for a single build (an flock extends this to other
server processes sharing the cache), and a build writes a temp file renamed into
place, so a half-built .sif is never used.

Like bubblewrap, a sandbox is two host folders (workspace, tmp) and one
``apptainer exec`` per command or shell, all binding the same folders:

  apptainer exec --containall --cleanenv --writable-tmpfs [--fakeroot]
                 [--net --network none] --home <workspace>:/workspace
                 --bind <tmp>:/tmp --pwd /workspace <image.sif> env HOME=/tmp <command>

``--containall`` gives each invocation its own PID and IPC namespaces and an empty
environment (variables come in as APPTAINERENV_*, which also carries commas
safely, unlike ``--env``). rlimits are set by ``prlimit`` before apptainer, except
RLIMIT_NPROC: apptainer's user namespace is not ours to enter before the command
starts, so a pids limit needs cgroups (``ApptainerConfig.cgroup_limits`` passes
``--memory``/``--pids-limit``, which need cgroups v2 delegated to the user).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Self

from rollserve.sandbox import diskcap, rsscap
from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import (
    SERVER_DIR,
    WORKDIR,
    BadImageReference,
    ImageRuntime,
    SandboxError,
    SandboxSpec,
)
from rollserve.sandbox.common import FolderRuntime, FolderSandbox
from rollserve.sandbox.config import ApptainerConfig
from rollserve.sandbox.folders import SandboxFolders, new_sandbox_id
from rollserve.sandbox.host import find_binary, missing_binary, run_command
from rollserve.sandbox.owner import OwnerEntry
from rollserve.sandbox.process import HostProcess

__all__ = ["ApptainerConfig", "ApptainerRuntime", "ApptainerSandbox", "ImageCache", "cache_name"]

BINARIES = ("apptainer", "singularity")
BUILDABLE = (
    "docker://",
    "docker-archive:",
    "docker-daemon:",
    "oci://",
    "oci-archive:",
    "oras://",
    "library://",
    "shub://",
)
INSTALL_HINT = (
    "install Apptainer (https://apptainer.org/docs/admin/main/installation.html; "
    "on a cluster often `module load apptainer`)"
)


def binaries(name: str) -> list[str]:
    """The binaries runtime ``name`` may run: the one named first, then the other."""
    return [name, *(binary for binary in BINARIES if binary != name)]


def cache_name(reference: str) -> str:
    """A file name for ``reference``: readable, and unique by its hash."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", reference.split("://", 1)[-1])[:60]
    return f"{readable}-{hashlib.sha256(reference.encode()).hexdigest()[:16]}.sif"


class ImageCache:
    """Turns an image reference into a local .sif, building each reference once."""

    def __init__(self, folder: Path, binary: str, max_builds: int, build_timeout: float) -> None:
        self.folder = folder
        self.binary = binary
        self.build_timeout = build_timeout
        self._builds = asyncio.Semaphore(max_builds)
        self._locks: dict[str, asyncio.Lock] = {}

    def path_for(self, reference: str) -> Path:
        return self.folder / cache_name(reference)

    async def ensure(self, reference: str) -> Path:
        if not reference.startswith(BUILDABLE):
            path = Path(reference)
            if not path.is_file():
                raise SandboxError(
                    f"apptainer: image {reference!r} is neither a file nor a "
                    f"reference to build from ({', '.join(BUILDABLE)})"
                )
            return path
        target = self.path_for(reference)
        if target.exists():
            return target
        lock = self._locks.setdefault(target.name, asyncio.Lock())
        async with lock:  # rollouts of this server that need this image wait here
            if target.exists():
                return target
            self.folder.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(self.folder / f"{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                # Other servers sharing the cache: flock blocks, so it waits in a thread.
                await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)
                if not target.exists():
                    async with self._builds:
                        await self._build(reference, target)
            finally:
                os.close(lock_fd)  # (releases the flock)
        return target

    async def _build(self, reference: str, target: Path) -> None:
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        # A build is the server's own work (not the sandbox's): it keeps the server's
        # environment (proxies, registry credentials), layers cached next to the images.
        env = dict(os.environ)
        env.setdefault("APPTAINER_CACHEDIR", str(self.folder / "layers"))
        env.setdefault("SINGULARITY_CACHEDIR", str(self.folder / "layers"))
        try:
            result = await run_command(
                [self.binary, "build", str(partial), reference], self.build_timeout, env=env, max_output=16384
            )
            if not result.ok or not partial.is_file():
                why = "timed out" if result.timed_out else f"exit {result.exit_code}"
                raise SandboxError(
                    f"apptainer build of {reference} failed ({why}): {(result.stderr or result.stdout)[-2000:]}"
                )
            os.replace(partial, target)  # atomic: a .sif is complete or absent
        finally:
            partial.unlink(missing_ok=True)


class ApptainerRuntime(FolderRuntime[ApptainerConfig], ImageRuntime[ApptainerConfig]):
    name = "apptainer"
    config_model = ApptainerConfig

    def __init__(self, state_dir: Path | str | None = None, config: ApptainerConfig | None = None) -> None:
        super().__init__(state_dir, config or ApptainerConfig())
        self.binary = find_binary(binaries(self.config.runtime)) or self.config.runtime
        self.name = Path(self.binary).name
        cache = self.config.image_cache
        if cache is None:
            cache = (
                Path(state_dir) / "images" if state_dir is not None else Path.home() / ".cache" / "rollserve" / "sif"
            )
        self.images = ImageCache(cache, self.binary, self.config.max_concurrent_builds, self.config.build_timeout)

    @classmethod
    def unavailable_reason(cls, config: ApptainerConfig | None = None) -> str | None:
        if find_binary(binaries((config or ApptainerConfig()).runtime)) is None:
            return missing_binary(BINARIES, INSTALL_HINT)
        return None

    def caps(self) -> dict[str, str]:
        if self.config.cgroup_limits:
            memory, pids = ("apptainer --memory (cgroup), swap included", "apptainer --pids-limit (cgroup)")
        else:
            memory = f"{rl.MEMORY_PER_PROCESS} (cgroup_limits is off)"
            pids = "NOT enforced (cgroup_limits is off)"
        mode = rsscap.mode_caps(
            self.config.resident_poll, "apptainer --memory (cgroup)" if self.config.cgroup_limits else None
        )
        return {
            "memory_mb": memory,
            "memory_mode": mode,
            "pids": pids,
            **rl.PER_PROCESS,
            "disk_mb": diskcap.MECHANISM + "; writes to the image's own folders go to "
            "--writable-tmpfs, sized by apptainer.conf's 'sessiondir max size'",
            "tmpfs_mb": "/dev/shm: a host folder under the disk cap",
        }

    async def start(self, spec: SandboxSpec) -> ApptainerSandbox:
        if reason := self.unavailable_reason(self.config):
            raise SandboxError(reason)
        reference = spec.image or self.config.default_image
        if not reference:
            raise SandboxError(
                "apptainer: the spec needs an image (.sif or docker://...), or the runtime a default_image"
            )
        image = await asyncio.wait_for(self.images.ensure(reference), self.config.build_timeout + spec.start_timeout)
        sandbox_id = new_sandbox_id(self.name)
        folders, entry = self.open_folders(sandbox_id, spec, self.config.root)
        folders.make_shm()
        sandbox = ApptainerSandbox(self, sandbox_id, spec, folders, entry, image)
        sandbox.start_caps()
        await sandbox.seed()
        return sandbox

    # -- images (rollserve images pull): .sif files built into the cache ---------------

    @classmethod
    def for_pulling(cls, config: ApptainerConfig, image_cache: Path, concurrency: int, timeout: float) -> Self:
        return cls(
            None,
            config.model_copy(
                update={"image_cache": image_cache, "max_concurrent_builds": concurrency, "build_timeout": timeout}
            ),
        )

    def images_unavailable_reason(self) -> str | None:
        return self.unavailable_reason(self.config)

    def image_reference(self, reference: str) -> str:
        """A bare docker name (``python:3.12``) is built as ``docker://python:3.12``."""
        reference = reference.strip()
        is_path = reference.startswith(("/", "./", "../", "~")) or reference.endswith(".sif")
        if reference.startswith(BUILDABLE) or is_path or "://" in reference:
            return reference
        return f"docker://{reference}"

    def image_location(self) -> Path:
        return self.images.folder

    async def image_cached(self, reference: str) -> bool:
        if not reference.startswith(BUILDABLE):
            if not Path(reference).expanduser().is_file():
                raise BadImageReference(
                    f"{reference!r} is neither a .sif file nor a "
                    f"reference apptainer builds from ({', '.join(BUILDABLE)})"
                )
            return True
        return self.images.path_for(reference).exists()

    async def pull_image(self, reference: str) -> None:
        await self.images.ensure(reference)


class ApptainerSandbox(FolderSandbox):
    def __init__(
        self,
        owner: ApptainerRuntime,
        sandbox_id: str,
        spec: SandboxSpec,
        folders: SandboxFolders,
        entry: OwnerEntry,
        image: Path,
    ) -> None:
        super().__init__(
            owner.name,
            sandbox_id,
            spec,
            folders,
            entry,
            resident_poll=owner.config.resident_poll,
            memory_bounded=owner.config.cgroup_limits,
        )
        self.image = image
        self._owner = owner
        self._prefix = rl.prlimit_argv(
            rl.rlimits(spec.limits, nproc=False, address_space=not owner.config.cgroup_limits)
        )

    def command(self, inner: list[str]) -> list[str]:
        """The host argv that runs ``inner`` in this sandbox (without env and limits)."""
        config = self._owner.config
        args = [self._owner.binary, "exec", "--containall", "--cleanenv", "--writable-tmpfs"]
        if config.fakeroot:
            args.append("--fakeroot")
        if not self.spec.network:
            args += ["--net", "--network", "none"]
        if config.cgroup_limits:
            args += ["--memory", f"{self.spec.limits.memory_mb}M", "--pids-limit", str(self.spec.limits.pids)]
        # /dev/shm: --contain's own is an unsized tmpfs (half the host's RAM); a folder
        # of the sandbox's instead, under the disk cap.
        args += [
            "--home",
            f"{self.folders.workspace}:{WORKDIR}",
            "--bind",
            f"{self.folders.tmp}:/tmp",
            "--bind",
            f"{self.folders.base / 'shm'}:/dev/shm",
        ]
        for alias in self.workspace_aliases():
            args += ["--bind", f"{self.folders.workspace}:{alias}"]
        for path in self.spec.folders:
            args += ["--bind", f"{self.folders.own(path)}:{path}"]
        args += ["--bind", f"{self.folders.server}:{SERVER_DIR}:ro"]
        for inside, host in self.spec.readonly_binds.items():
            args += ["--bind", f"{host}:{inside}:ro"]
        for path in self.spec.hide:  # an empty read-only folder over each (e.g. /r2e_tests)
            args += ["--bind", f"{self.folders.empty}:{path}:ro"]
        args += [
            "--pwd",
            WORKDIR,
            *config.extra_args,
            str(self.image),
            # HOME is the private /tmp (apptainer refuses APPTAINERENV_HOME, and
            # --home is what binds the workspace): caches stay out of the workspace.
            "env",
            "HOME=/tmp",
            *inner,
        ]
        return args

    def environment(self, env: dict[str, str] | None, pty: bool) -> dict[str, str]:
        """The host environment of the apptainer process: the sandbox's variables
        travel as APPTAINERENV_* (and SINGULARITYENV_* for singularity)."""
        values = {
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            **({"TERM": "xterm"} if pty else {}),
            **self.spec.env,
            **(env or {}),
        }
        prefix = "SINGULARITYENV_" if self.runtime == "singularity" else "APPTAINERENV_"
        host = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
        host.update({prefix + key: value for key, value in values.items()})
        return host

    async def _launch(
        self, inner: list[str], *, pty: bool, env: dict[str, str] | None, merge_stderr: bool
    ) -> HostProcess:
        return self._start_host(
            [*self._prefix, *self.command(inner)], pty=pty, env=self.environment(env, pty), merge_stderr=merge_stderr
        )

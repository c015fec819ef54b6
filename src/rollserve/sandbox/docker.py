"""The ``docker`` / ``podman`` runtime: one container per sandbox, commands exec'd into it.

For laptops and clouds where an engine is already running. ``start`` creates a
container that only sleeps (``run -d ... sleep infinity``) with the limits on it —
memory (swap off), pids, open files, no network unless asked — and the workspace
and tmp folders bound in; every ``exec``/``spawn`` is an ``<engine> exec`` into it, so
unlike bubblewrap all processes of a sandbox share one PID namespace. ``close`` is
``rm -f``. The container carries labels naming the owner, and its id is in the owner
record, so a restarted server removes exactly its dead predecessor's containers.

A killed ``docker exec`` client does not kill what it started in the container, so
each exec'd command first writes its pid to a file in the sandbox's /tmp and runs in
a session of its own (``setsid``); at a timeout we ``kill -KILL -- -<pid>`` that
session's group inside the container.

Podman: the engine's default OCI runtime may not work everywhere (crun without
cgroups v2); ``DockerConfig.podman_runtime`` (default runc) is passed as
``--runtime``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import uuid
from pathlib import Path
from typing import Self

from rollserve.sandbox import diskcap
from rollserve.sandbox.base import (
    SERVER_DIR,
    WORKDIR,
    BadImageReference,
    ExecResult,
    ImageRuntime,
    SandboxError,
    SandboxSpec,
)
from rollserve.sandbox.common import FolderRuntime, FolderSandbox, shell_argv
from rollserve.sandbox.config import DockerConfig
from rollserve.sandbox.folders import SandboxFolders, new_sandbox_id
from rollserve.sandbox.host import find_binary, missing_binary, run_command
from rollserve.sandbox.owner import OwnerEntry, OwnerRecord, remove_tree, this_process
from rollserve.sandbox.process import HostProcess

__all__ = ["DockerConfig", "DockerRuntime", "DockerSandbox", "engine_unavailable_reason"]

PID_DIR = "/tmp/.rollserve-exec"
INSTALL_HINTS = {
    "docker": "install Docker Engine (https://docs.docker.com/engine/install/) and start its daemon",
    "podman": "install Podman (https://podman.io/docs/installation)",
}


def engine_missing(engine: str) -> str | None:
    """Why ``engine`` cannot even be run (not on PATH), or None."""
    if find_binary([engine]) is None:
        return missing_binary([engine], INSTALL_HINTS.get(engine, f"install {engine}"))
    return None


@functools.lru_cache(maxsize=8)
def engine_unavailable_reason(engine: str) -> str | None:
    """Why ``engine`` cannot run containers here (not on PATH, no daemon), or None."""
    if missing := engine_missing(engine):
        return missing
    try:
        info = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return f"`{engine} info` did not answer within 15 s"
    if info.returncode != 0:
        return f"`{engine} info` failed: {(info.stderr or info.stdout).strip()[-300:]}"
    return None


class DockerRuntime(FolderRuntime[DockerConfig], ImageRuntime[DockerConfig]):
    name = "docker"
    config_model = DockerConfig

    def __init__(self, state_dir: Path | str | None = None, config: DockerConfig | None = None) -> None:
        super().__init__(state_dir, config or DockerConfig())
        self.engine = self.config.runtime
        self.global_args = (
            ["--runtime", self.config.podman_runtime] if self.engine == "podman" and self.config.podman_runtime else []
        )

    @classmethod
    def unavailable_reason(cls, config: DockerConfig | None = None) -> str | None:
        return engine_unavailable_reason((config or DockerConfig()).runtime)

    def caps(self) -> dict[str, str]:
        disk = diskcap.MECHANISM + (
            "; the container's own filesystem: --storage-opt size="
            if self.config.rootfs_size
            else "; the container's own filesystem is NOT capped (rootfs_size is off)"
        )
        return {
            "memory_mb": "--memory for the whole container, swap off (cgroup)",
            "memory_mode": "no effect: --memory (cgroup) bounds the container's memory in either mode",
            "pids": "--pids-limit for the whole container (cgroup)",
            "file_size_mb": "--ulimit fsize: per file",
            "open_files": "--ulimit nofile",
            "cpu_seconds": "--ulimit cpu: per process",
            "disk_mb": disk,
            "tmpfs_mb": "--shm-size: /dev/shm",
        }

    @classmethod
    def reap_resources(cls, record: OwnerRecord) -> list[str]:
        """``rm -f`` the container (with the engine and arguments that made it)."""
        engine = record.engine or record.runtime
        if not record.container:
            return []
        try:
            subprocess.run(
                [engine, *record.engine_args, "rm", "-f", record.container],
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return [f"{record.sandbox_id}: container {record.container}: {error}"]
        return []

    def run_command(self, spec: SandboxSpec, name: str, folders: SandboxFolders) -> list[str]:
        """The ``<engine> run -d`` argv that creates a sandbox's container."""
        limits = spec.limits
        owner = this_process()
        args = [
            self.engine,
            *self.global_args,
            "run",
            "-d",
            "--name",
            name,
            "--label",
            "rollserve.sandbox=1",
            "--label",
            f"rollserve.owner={owner.pid}:{owner.started}",
            "--network",
            "bridge" if spec.network else "none",
            "--memory",
            f"{limits.memory_mb}m",
            "--memory-swap",
            f"{limits.memory_mb}m",
            "--pids-limit",
            str(limits.pids),
            "--ulimit",
            f"nofile={limits.open_files}:{limits.open_files}",
            "--ulimit",
            f"fsize={limits.file_size_mb << 20}:{limits.file_size_mb << 20}",
            "--ulimit",
            "core=0:0",
            "--ulimit",
            f"cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
            "--shm-size",
            f"{limits.tmpfs_mb}m",
            "--security-opt",
            "no-new-privileges",
            "-v",
            f"{folders.workspace}:{WORKDIR}",
            "-v",
            f"{folders.tmp}:/tmp",
            "-w",
            WORKDIR,
            "-e",
            "HOME=/tmp",
            "-e",
            "LANG=C.UTF-8",
        ]
        for alias in spec.workspace_aliases:
            args += ["-v", f"{folders.workspace}:{alias}"]
        for path in spec.folders:
            args += ["-v", f"{folders.own(path)}:{path}"]
        args += ["-v", f"{folders.server}:{SERVER_DIR}:ro"]
        for inside, host in spec.readonly_binds.items():
            args += ["-v", f"{host}:{inside}:ro"]
        for path in spec.hide:  # an empty read-only folder over each (e.g. /r2e_tests)
            args += ["-v", f"{folders.empty}:{path}:ro"]
        if self.config.rootfs_size:
            args += ["--storage-opt", f"size={limits.disk_mb}m"]
        for key, value in spec.env.items():
            args += ["-e", f"{key}={value}"]
        args += [*self.config.extra_run_args, spec.image or self.config.default_image, "sleep", "infinity"]
        return args

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        if reason := self.unavailable_reason(self.config):
            raise SandboxError(reason)
        sandbox_id = new_sandbox_id(self.name)
        name = f"rollserve-{sandbox_id}"
        folders, entry = self.open_folders(
            sandbox_id, spec, self.config.root, container=name, engine=self.engine, engine_args=self.global_args
        )
        # Recorded before it exists: a crash during `run` still leaves a record to reap.
        step, result = "seed the workspace", await self._seed(spec, name, folders)
        if result is None or result.ok:
            step, result = (
                "run",
                await run_command(
                    self.run_command(spec, name, folders), min(spec.start_timeout, self.config.engine_timeout)
                ),
            )
        if not result.ok:
            await self.remove_container(name)
            await asyncio.to_thread(remove_tree, folders.base)
            entry.delete()
            raise SandboxError(f"{self.engine}: could not {step}: {result.failure(1000)}")
        sandbox = DockerSandbox(self, sandbox_id, spec, folders, entry, name)
        sandbox.start_caps()
        return sandbox

    def seed_commands(self, spec: SandboxSpec, name: str, folders: SandboxFolders) -> list[list[str]]:
        """``create`` a stopped container of the image, ``cp`` its seed folder into the
        workspace, ``rm`` it: the workspace holds the image's files before the
        sandbox's container mounts it (there, and at its aliases)."""
        base = [self.engine, *self.global_args]
        seeder = f"{name}-seed"
        return [
            [
                *base,
                "create",
                "--name",
                seeder,
                "--label",
                "rollserve.sandbox=1",
                spec.image or self.config.default_image,
                "true",
            ],
            [*base, "cp", f"{seeder}:{spec.workspace_seed}/.", str(folders.workspace)],
            [*base, "rm", "-f", seeder],
        ]

    async def _seed(self, spec: SandboxSpec, name: str, folders: SandboxFolders) -> ExecResult | None:
        """The result of ``create`` if it failed, else of ``cp``; None without a seed."""
        if spec.workspace_seed is None:
            return None
        create, copy, remove = self.seed_commands(spec, name, folders)
        timeout = max(spec.start_timeout, self.config.engine_timeout)
        result = await run_command(create, timeout)
        if result.ok:
            result = await run_command(copy, max(timeout, 300.0))
        await run_command(remove, timeout)
        return result

    async def remove_container(self, container: str) -> None:
        """``rm -f`` a container of this runtime's (killing everything in it)."""
        await run_command([self.engine, *self.global_args, "rm", "-f", container], self.config.engine_timeout)

    # -- images (rollserve images pull): into the engine's own store -------------------

    @classmethod
    def for_pulling(cls, config: DockerConfig, image_cache: Path, concurrency: int, timeout: float) -> Self:
        return cls(None, config.model_copy(update={"pull_timeout": timeout}))

    def images_unavailable_reason(self) -> str | None:
        return engine_missing(self.engine)  # (a missing daemon shows in each pull's error)

    def image_reference(self, reference: str) -> str:
        """``docker://`` dropped; an apptainer reference or .sif refused."""
        reference = reference.strip()
        if reference.startswith("docker://"):
            return reference[len("docker://") :]
        if "://" in reference or reference.endswith(".sif"):
            raise BadImageReference(
                f"{self.engine} cannot pull {reference!r} (an apptainer image); use --runtime apptainer"
            )
        return reference

    def image_location(self) -> None:
        return None

    async def image_cached(self, reference: str) -> bool:
        result = await run_command([self.engine, "image", "inspect", reference], 60.0, max_output=4096)
        return result.ok

    async def pull_image(self, reference: str) -> None:
        result = await run_command([self.engine, "pull", reference], self.config.pull_timeout, max_output=16384)
        if not result.ok:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SandboxError(
                f"{self.engine} pull {reference} failed ({why}): {(result.stderr or result.stdout).strip()[-2000:]}"
            )


class DockerSandbox(FolderSandbox):
    def __init__(
        self,
        owner: DockerRuntime,
        sandbox_id: str,
        spec: SandboxSpec,
        folders: SandboxFolders,
        entry: OwnerEntry,
        container: str,
    ) -> None:
        super().__init__(owner.name, sandbox_id, spec, folders, entry)
        self.container = container
        self._owner = owner

    def exec_command(
        self, inner: list[str], env: dict[str, str] | None, pty: bool, interactive: bool = True
    ) -> list[str]:
        owner = self._owner
        args = [owner.engine, *owner.global_args, "exec"]
        if interactive:
            args.append("-i")
        if pty:
            args.append("-t")  # the engine's PTY inside, bridged to ours (raw mode)
            args += ["-e", "TERM=xterm"]
        args += ["-w", WORKDIR]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        return [*args, self.container, *inner]

    async def _launch(
        self, inner: list[str], *, pty: bool, env: dict[str, str] | None, merge_stderr: bool
    ) -> HostProcess:
        return self._start_host(
            self.exec_command(inner, env, pty),
            pty=pty,
            merge_stderr=merge_stderr,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")},
        )

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
        # (cpu_budget: the watcher sees only the exec client here, not the container's
        # processes; see cpucap.py)
        pid_file = f"{PID_DIR}/{uuid.uuid4().hex}"
        # Its own session (setsid), its pid in a file: what a timeout kills in there.
        inner = [
            "setsid",
            "--wait",
            "sh",
            "-c",
            f'mkdir -p {PID_DIR} && echo $$ > {pid_file} && exec "$@"',
            "sh",
            *shell_argv(command),
        ]
        result = await self._collect(inner, timeout, stdin, env, max_output, cpu_budget)
        if result.timed_out or result.cap == "cpu":
            kill = f'kill -KILL -- -"$(cat {pid_file})" 2>/dev/null; rm -f {pid_file}'
            await run_command(self.exec_command(["sh", "-c", kill], None, False, False), 30)
        else:
            host_pid_file = self.folders.tmp / pid_file.removeprefix("/tmp/")
            host_pid_file.unlink(missing_ok=True)
        return result

    async def kill_for_cap(self, cap: str, notice: str) -> None:
        # A killed `exec` client leaves its command running in the container: kill
        # every process there but the container's own (pid 1, `sleep infinity`).
        await run_command(
            self.exec_command(["sh", "-c", "kill -KILL -1"], None, False, False), self._owner.config.engine_timeout
        )
        await super().kill_for_cap(cap, notice)

    async def _release(self) -> None:
        await self._owner.remove_container(self.container)  # kills everything inside

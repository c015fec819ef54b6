"""A Harbor task's environment in the runtime in force.

- bubblewrap (the host's system): the task declares no image (``docker_image`` unset,
  or one the operator declares the host stands in for: the option ``host_images``)
  and its Dockerfile, if any, only lays files out (``dockerfile``: ``RUN`` and the rest
  refused at submit). Its files go into the workspace, mounted at the task's workdir
  (the Dockerfile's last ``WORKDIR`` or ``environment.workdir``: a top-level folder such
  as ``/app``; none: ``/workspace``); without a Dockerfile every file of
  ``environment/`` goes there.
- docker/podman: ``docker_image``, or the image built from ``environment/`` (``<engine>
  build``, once per content, bounded by ``build_timeout_sec``); the workspace is seeded
  from the image's workdir and mounted there.
- apptainer: ``docker_image`` (as ``docker://``); a Dockerfile alone is refused (apptainer
  builds no Dockerfile).
- On image runtimes the workdir is ``environment.workdir``, else the last ``WORKDIR`` of
  the task's Dockerfile, else ``/workspace`` (a bare ``docker_image``'s own is not read).

Always: no network, ``/tests`` and ``/logs`` (``/solution`` for the oracle) folders of
the sandbox's own, the server's task root and the bundled tasks hidden, ``environment.env`` (after the
Dockerfile's ``ENV``), ``memory_mb`` and ``storage_mb`` as the sandbox's caps.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from rollserve.errors import InfraError
from rollserve.handlers.base import HandlerContext, RolloutView
from rollserve.handlers.harbor.dockerfile import last_workdir
from rollserve.handlers.harbor.folder import HarborTask, TaskProblem, tar_of
from rollserve.handlers.harbor.instances import BUNDLED, cache_folder
from rollserve.handlers.harness import harness_limits
from rollserve.handlers.presets import HarnessSpec, harness_binds
from rollserve.handlers.sandboxed import open_sandbox
from rollserve.sandbox.base import RESERVED, WORKDIR, Sandbox, SandboxLimits, SandboxSpec

IMAGE_RUNTIMES = ("docker", "podman", "apptainer", "singularity")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Layout:
    sandbox: Sandbox
    workdir: str
    env: dict[str, str]


def uses_images(runtime: str | None) -> bool:
    return runtime in IMAGE_RUNTIMES


def check_runtime(task: HarborTask, runtime: str | None) -> None:
    """TaskProblem when ``task``'s environment cannot be made on ``runtime``."""
    if runtime == "local":
        raise TaskProblem(
            "environment",
            "the local runtime cannot hide /tests from the agent: "
            "run harbor tasks on bubblewrap, docker, podman or apptainer",
        )
    env = task.config.environment
    if runtime in ("apptainer", "singularity") and env.docker_image is None and task.dockerfile:
        raise TaskProblem(
            "environment/Dockerfile",
            "apptainer builds no Dockerfile: give environment.docker_image (a built image) or use docker/podman",
        )
    check_workdir(env.workdir)
    if uses_images(runtime) and (env.docker_image or task.dockerfile):
        check_workdir(image_workdir(task), "environment/Dockerfile: WORKDIR")
    else:
        plan = task.host_plan()
        check_workdir(plan.workdir, "environment/Dockerfile: WORKDIR")
        layout_files(task.folder / "environment", plan.copies, plan.workdir or WORKDIR)  # (sources)


def image_workdir(task: HarborTask) -> str:
    """The workdir on an image runtime: ``environment.workdir``, else the last ``WORKDIR``
    of the task's own Dockerfile (Terminal-Bench's ``WORKDIR /app``), else ``/workspace``
    (a bare ``docker_image``: its own WORKDIR is not read)."""
    workdir = task.config.environment.workdir
    if workdir is None and task.dockerfile is not None:
        workdir = last_workdir(task.dockerfile)
    return workdir or WORKDIR


SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_workdir(workdir: str | None, where: str = "task.toml: environment.workdir") -> None:
    """TaskProblem naming ``where`` unless ``workdir`` is a top-level folder whose name
    is of ``[A-Za-z0-9._-]`` (it reaches shells, mounts and ``cd``)."""
    if workdir is None or workdir == WORKDIR:
        return
    name = workdir.strip("/")
    if (
        not workdir.startswith("/")
        or "/" in name
        or not name
        or name in RESERVED
        or name in ("tests", "logs", "solution", ".", "..")
    ):
        raise TaskProblem(
            where,
            f"{workdir}: the workdir must be a top-level folder such as "
            "/app (the sandbox's workspace is mounted there)",
        )
    if not SAFE_NAME.fullmatch(name):
        raise TaskProblem(where, f"{workdir!r}: the workdir's name may only have letters, digits, '.', '_' and '-'")


async def open_environment(
    ctx: HandlerContext,
    rollout: RolloutView,
    task: HarborTask,
    *,
    oracle: bool,
    hidden: list[Path],
    harness: HarnessSpec | None = None,
) -> Layout:
    runtime = ctx.sandboxes.name if ctx.sandboxes is not None else None
    config = task.config.environment
    image, seed = None, None
    if uses_images(runtime) and (config.docker_image or task.dockerfile):
        image = config.docker_image or await build_image(runtime or "docker", task)
        if runtime in ("apptainer", "singularity") and "://" not in image:
            image = f"docker://{image}"
        workdir = image_workdir(task)
        seed = None if workdir == WORKDIR else workdir
        plan_env: dict[str, str] = {}
        copies: list[tuple[Path, str]] = []
    else:
        plan = task.host_plan()
        workdir = plan.workdir or WORKDIR
        plan_env = plan.env
        copies = layout_files(task.folder / "environment", plan.copies, workdir)
    env = {"PATH": PATH, **plan_env, **config.env}
    limits = SandboxLimits(
        memory_mb=config.memory_mb or 2048, disk_mb=config.storage_mb or 4096, pids=512, cpu_seconds=3600
    )
    if harness is not None:  # memory resident for the whole sandbox; its install shown
        limits = harness_limits(limits)
    spec = SandboxSpec(
        image=image,
        env=env,
        network=False,
        limits=limits,
        workspace_aliases=[] if workdir == WORKDIR else [workdir],
        workspace_seed=seed,
        folders=["/tests", "/logs", *(["/solution"] if oracle else [])],
        hide=hidden_folders([*hidden, cache_folder(), BUNDLED]),
        readonly_binds=harness_binds(harness),
        start_timeout=config.build_timeout_sec,
    )
    sandbox = await open_sandbox(ctx, rollout, spec)
    if copies:
        files = await asyncio.to_thread(tar_of, copies)
        laid = await sandbox.exec(f"tar -x --no-same-owner -C {WORKDIR} -f -", timeout=120, stdin=files)
        if not laid.ok:
            raise InfraError(f"could not lay the task's environment files out: {laid.failure()}")
    made = await sandbox.exec("mkdir -p /logs/agent /logs/verifier", timeout=30)
    if not made.ok:
        raise InfraError(f"could not make /logs: {made.failure()}")
    return Layout(sandbox, workdir, env)


def hidden_folders(paths: list[Path]) -> list[str]:
    """``paths`` resolved, once each, less those under /tmp (a sandbox's /tmp is its own).
    The bundled tasks (the package's data) are always among them: their tests and
    solutions stay the server's when the operator's root is elsewhere."""
    out: list[str] = []
    for path in paths:
        resolved = path.resolve()
        if not resolved.is_relative_to("/tmp") and str(resolved) not in out:
            out.append(str(resolved))
    return out


def layout_files(context: Path, copies: list[tuple[str, str]], workdir: str) -> list[tuple[Path, str]]:
    """(host path, path under the workspace) for each COPY of the plan; a source out of
    the build context is a TaskProblem."""
    base = context.resolve()
    out: list[tuple[Path, str]] = []
    for source, destination in copies:
        path = (base / source).resolve()
        if not path.is_relative_to(base):
            raise TaskProblem("environment/Dockerfile", f"COPY {source}: outside environment/")
        if not path.exists():
            if source == "." and not base.exists():
                continue
            raise TaskProblem("environment/Dockerfile", f"COPY {source}: no such file in environment/")
        relative = posixpath.relpath(destination.rstrip("/") or "/", workdir)
        relative = "" if relative == "." else relative
        if path.is_file() and destination.endswith("/"):
            relative = posixpath.join(relative, path.name)
        out.append((path, relative))
    return out


async def healthcheck(sandbox: Sandbox, task: HarborTask, workdir: str, env: dict[str, str]) -> None:
    """``[environment].healthcheck``: the command until it succeeds, ``retries`` more times
    at most; a task whose environment never gets healthy fails INIT (infra: masked)."""
    check = task.config.environment.healthcheck
    if check is None:
        return
    command = f"cd {shlex.quote(workdir)} && {check.command}"
    result = None
    for attempt in range(check.retries + 1):
        if attempt:
            await asyncio.sleep(check.interval_sec)
        result = await sandbox.exec(command, timeout=check.timeout_sec, env=env)
        if result.ok:
            return
    assert result is not None
    raise InfraError(f"the task's healthcheck failed {check.retries + 1} times: {result.failure()}")


# --- images built from environment/ (docker, podman) ----------------------------------------
_BUILT: dict[str, asyncio.Lock] = {}


def image_tag(task: HarborTask) -> str:
    digest = hashlib.sha256(tar_of([(task.folder / "environment", ".")])).hexdigest()[:20]
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in task.folder.name.lower())
    return f"rollserve-harbor/{name[:60] or 'task'}:{digest}"


def build_command(engine: str, task: HarborTask, tag: str) -> list[str]:
    """``<engine> build`` of the task's environment/ (no network at build: a Dockerfile
    that fetches anything fails here, not silently later)."""
    return [
        engine,
        "build",
        "--network",
        "none",
        "-t",
        tag,
        "-f",
        str(task.folder / "environment" / "Dockerfile"),
        str(task.folder / "environment"),
    ]


async def build_image(engine: str, task: HarborTask) -> str:
    """The image built from the task's Dockerfile (once per content), bounded by
    ``build_timeout_sec``; a build that fails is the task's, not the agent's (infra)."""
    tag = await asyncio.to_thread(image_tag, task)
    lock = _BUILT.setdefault(tag, asyncio.Lock())
    async with lock:
        inspect = await _run([engine, "image", "inspect", tag], 60)
        if inspect[0] == 0:
            return tag
        code, output = await _run(build_command(engine, task, tag), task.config.environment.build_timeout_sec)
        if code != 0:
            raise InfraError(f"{engine} build of {task.name} failed: {output[-1500:]}")
    return tag


async def _run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as error:
        raise InfraError(f"cannot run {argv[0]}: {error}") from error
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return None, f"timed out after {timeout:g} s"
    return process.returncode, out.decode("utf-8", "replace")

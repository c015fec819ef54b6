"""Where a SWE task runs: the environment image or the host, and the repository in
the workspace.

Two modes (``SWEOptions.environment``; ``auto`` picks by the server's runtime):

- **image** (apptainer/singularity, docker/podman): the instance's evaluation image,
  by the usual SWE-bench naming (``swebench/sweb.eval.x86_64.<id>:latest`` with
  ``__`` written ``_1776_``; SWE-Gym's under ``xingyaoww/``, ``__`` as ``_s_``;
  R2E-Gym's ``docker_image``), prefixes overridable. The image's repository
  (``/testbed``) is copied into the workspace when the sandbox starts and the
  workspace is also mounted at ``/testbed``, so the image's scripts and editable
  installs see the agent's edits.
- **host** (bubblewrap, or local): the host root (or a rootfs folder) read-only, and
  the repository materialised at ``base_commit`` from a git bundle or a local mirror:
  ``<mirror>/<instance_id>.bundle``, ``<owner>__<name>.bundle``, ``<owner>__<name>.git``
  or ``<owner>/<name>[.git]``; the bundled ``swe-mini`` suite is always searched last.
  A mirror is turned into a bundle of the history up to ``base_commit`` only (no
  future commits, so no future fixes), cached per commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import InfraError
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

IMAGE_RUNTIMES = ("apptainer", "singularity", "docker", "podman")
BUNDLE_NAME = ".rollserve-repo.bundle"


class SWEOptions(BaseModel):
    """The SWE handler's settings (``rollserve serve --handler-options '{"swe": {...}}'``)."""

    model_config = ConfigDict(extra="forbid")

    environment: Literal["auto", "image", "host"] = Field(
        "auto", description="image: the instance's evaluation image (apptainer/docker); "
        "host: the host root or a rootfs plus the repository from a bundle or mirror; "
        "auto: image under apptainer/singularity/docker/podman, else host")
    image_prefix: str = Field("swebench/sweb.eval.x86_64.",
                              description="SWE-bench images: prefix + instance id")
    swe_gym_image_prefix: str = Field("xingyaoww/sweb.eval.x86_64.",
                                      description="SWE-Gym images: prefix + instance id")
    image_tag: str = "latest"
    image_repo_dir: str = Field("/testbed", description="where the image holds the repository")
    image_activate: str = Field(
        "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate "
        "&& conda activate testbed; fi",
        description="run first in image shells and test scripts (SWE-bench's conda env)")
    mirrors: list[Path] = Field(default_factory=list, description="folders of git bundles / mirrors")
    repo_cache: Path | None = Field(None, description="bundles made from mirrors (default "
                                    "~/.cache/rollserve/swe-repos)")
    rootfs: Path | None = Field(None, description="host mode: a rootfs folder instead of the host root")
    python: str | None = Field(None, description="host mode: the interpreter with pytest that "
                               "runs the tests (default: found in the sandbox)")
    empty_patch: Literal["unresolved", "run"] = Field(
        "unresolved", description="an empty candidate patch: unresolved without running "
        "tests, or run the tests anyway")
    test_timeout: float = Field(1800.0, gt=0, description="seconds for the test run")
    setup_timeout: float = Field(300.0, gt=0, description="seconds to materialise the repository")
    memory_mb: int = Field(4096, ge=256)
    pids: int = Field(512, ge=32)


def bundled_mirror() -> Path:
    return Path(str(importlib.resources.files("rollserve") / "data" / "swe_mini" / "bundles"))


def use_images(options: SWEOptions, runtime_name: str | None) -> bool:
    if options.environment != "auto":
        return options.environment == "image"
    return runtime_name in IMAGE_RUNTIMES


def image_name(task: SWETask, options: SWEOptions) -> str:
    """The docker reference of the task's environment image."""
    if task.image:
        return task.image
    instance = task.instance_id.lower()
    if task.schema == "swe-gym":
        return f"{options.swe_gym_image_prefix}{instance.replace('__', '_s_')}:{options.image_tag}"
    return f"{options.image_prefix}{instance.replace('__', '_1776_')}:{options.image_tag}"


def image_reference(task: SWETask, options: SWEOptions, runtime_name: str | None) -> str:
    """What the runtime's SandboxSpec.image takes: ``docker://...`` for apptainer."""
    name = image_name(task, options)
    if runtime_name in ("apptainer", "singularity") and "://" not in name \
            and not name.endswith(".sif"):
        return f"docker://{name}"
    return name


# --- host mode: the repository from a bundle or a mirror -----------------------------
def candidates(task: SWETask, mirrors: list[Path]) -> list[Path]:
    owner, _, name = task.repo.partition("/")
    paths = []
    for folder in [*mirrors, bundled_mirror()]:
        paths += [folder / f"{task.instance_id}.bundle", folder / f"{owner}__{name}.bundle",
                  folder / f"{owner}__{name}.git", folder / owner / f"{name}.git",
                  folder / owner / name]
    return paths


def find_source(task: SWETask, mirrors: list[Path]) -> Path:
    """The bundle or mirror that holds ``task``'s repository; InfraError if none."""
    for path in candidates(task, mirrors):
        if path.is_file() and path.suffix == ".bundle":
            return path
        if path.is_dir() and ((path / "HEAD").is_file() or (path / ".git").exists()):
            return path
    searched = ", ".join(str(m) for m in [*mirrors, bundled_mirror()])
    raise InfraError(f"no git bundle or mirror of {task.repo} for {task.instance_id} (searched "
                     f"{searched}); add one to the swe handler's 'mirrors', or run in image "
                     "mode (apptainer)")


_BUNDLE_LOCKS: dict[str, asyncio.Lock] = {}


async def bundle_for(task: SWETask, options: SWEOptions) -> Path:
    """A git bundle holding ``task.base_commit`` (a mirror becomes one, cached)."""
    source = find_source(task, options.mirrors)
    if source.suffix == ".bundle":
        return source
    cache = options.repo_cache or Path.home() / ".cache" / "rollserve" / "swe-repos"
    key = hashlib.sha256(f"{source.resolve()}@{task.base_commit}".encode()).hexdigest()[:16]
    target = cache / f"{task.repo.replace('/', '__')}-{task.base_commit[:12]}-{key}.bundle"
    lock = _BUNDLE_LOCKS.setdefault(str(target), asyncio.Lock())
    async with lock:
        if not target.is_file():
            await asyncio.to_thread(_bundle_from_mirror, source, task.base_commit, target)
    return target


def _bundle_from_mirror(mirror: Path, commit: str, target: Path) -> None:
    """History up to ``commit`` of ``mirror`` as a bundle at ``target`` (atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        clone = Path(tmp) / "repo"
        steps = [["git", "clone", "-q", "--bare", "--no-local", str(mirror), str(clone)],
                 ["git", "-C", str(clone), "update-ref", "refs/heads/main", commit],
                 ["git", "-C", str(clone), "bundle", "create", "-q", str(Path(tmp) / "b"), "main"]]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise InfraError(f"could not make a bundle of {mirror} at {commit}: "
                                 f"{' '.join(argv[:4])}: {done.stderr.strip()[-500:]}")
        os.replace(Path(tmp) / "b", target)


async def materialise(sandbox: Sandbox, task: SWETask, options: SWEOptions) -> None:
    """Put the repository at ``base_commit`` in the workspace (host mode)."""
    bundle = await bundle_for(task, options)
    await sandbox.write_file(BUNDLE_NAME, await asyncio.to_thread(bundle.read_bytes))
    base = task.base_commit
    # (Commands start in the workspace; the clone goes through a folder inside it, so
    # nothing is shared with other sandboxes even on the unconfined local runtime.)
    script = f"""set -e
git clone -q --no-checkout {BUNDLE_NAME} .rollserve-clone 2>&1
mv .rollserve-clone/.git .git
rm -rf .rollserve-clone {BUNDLE_NAME}
git cat-file -e '{base}^{{commit}}' 2>/dev/null || {{ echo "commit {base} is not in the bundle"; exit 3; }}
git checkout -q -f --detach {base}
git remote remove origin
git config user.email agent@rollserve.local
git config user.name rollserve-agent
"""
    result = await sandbox.exec(script, timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(f"could not materialise {task.repo} at {base} from {bundle.name}: "
                         f"{result.failure(800)}")


async def prepare_image_repo(sandbox: Sandbox, options: SWEOptions) -> None:
    """Image mode: the workspace holds the image's repository (seeded at start); make
    git usable on it (ownership may differ from the image's)."""
    # (Commands start in the workspace.)
    script = ("git config --global --add safe.directory '*' && "
              "git config --global user.email agent@rollserve.local && "
              "git config --global user.name rollserve-agent && git rev-parse HEAD")
    result = await sandbox.exec(script, timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(f"the image's repository ({options.image_repo_dir}) is not a git "
                         f"checkout: {result.failure()}")


def git_available() -> str | None:
    """None if git is on PATH here, else why the host mode cannot work."""
    return None if shutil.which("git") else "git is not installed (apt-get install git)"

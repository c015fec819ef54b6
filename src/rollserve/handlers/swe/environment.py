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
  Every source, bundle or mirror, is first cut to a bundle of one branch holding the
  history up to ``base_commit`` only (no later commits, so no later fixes; no other
  branches, tags or objects), cached per source and commit; the workspace's
  repository is cloned from that cut, with no remote and no reflog.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollserve.datasets import SWE_MINI_BUNDLES
from rollserve.errors import InfraError
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

IMAGE_RUNTIMES = ("apptainer", "singularity", "docker", "podman")
BUNDLE_NAME = ".rollserve-repo.bundle"


class SWEOptions(BaseModel):
    """The SWE handler's settings (``rollserve serve --handler-options '{"swe": {...}}'``)."""

    model_config = ConfigDict(extra="forbid")

    environment: Literal["auto", "image", "host"] = Field(
        "auto",
        description="image: the instance's evaluation image (apptainer/docker); "
        "host: the host root or a rootfs plus the repository from a bundle or mirror; "
        "auto: image under apptainer/singularity/docker/podman, else host",
    )
    image_prefix: str = Field("swebench/sweb.eval.x86_64.", description="SWE-bench images: prefix + instance id")
    swe_gym_image_prefix: str = Field("xingyaoww/sweb.eval.x86_64.", description="SWE-Gym images: prefix + instance id")
    image_tag: str = "latest"
    image_repo_dir: str = Field("/testbed", description="where the image holds the repository")
    image_activate: str = Field(
        "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate "
        "&& conda activate testbed; fi",
        description="run first in image shells and test scripts (SWE-bench's conda env)",
    )
    mirrors: list[Path] = Field(default_factory=list, description="folders of git bundles / mirrors")
    repo_cache: Path | None = Field(
        None, description="bundles made from mirrors (default ~/.cache/rollserve/swe-repos)"
    )
    rootfs: Path | None = Field(None, description="host mode: a rootfs folder instead of the host root")
    python: str | None = Field(
        None,
        description="host mode: the interpreter with pytest that "
        "runs the tests (default: found in the sandbox); checked at "
        "server start (a path must be visible in the sandboxes) and "
        "run at INIT and EVAL (a failure is infra, masked)",
    )
    empty_patch: Literal["unresolved", "run"] = Field(
        "unresolved", description="an empty candidate patch: unresolved without running tests, or run the tests anyway"
    )
    test_timeout: float = Field(
        1800.0, gt=0, description="seconds for the test run, and the most an instance's own test_timeout may ask for"
    )
    test_cpu_seconds: float | None = Field(
        None,
        gt=0,
        description="CPU seconds for a whole test run, all its processes "
        "together (a watcher kills it past them: sandbox/cpucap.py); stopped like a run past "
        "its timeout (stopped_tests). None: the run's timeout (a run on one core never spends it first)",
    )
    stopped_tests: Literal["agent", "masked"] = Field(
        "agent",
        description="a test run past its timeout or CPU budget, or killed by a "
        "signal, once the tests started: the agent's failure (reward 0, not masked), or "
        "masked (timeout/infra). A run stopped in its set-up, or whose set-up shows an "
        "environment fault, is infra",
    )
    canary: bool = Field(
        True,
        description="canaries: tests that must fail, made from the graded "
        "module's own tests (an assertion changed so it cannot hold) and "
        "written among them before the tests run; if one is reported passed "
        "while its original passed, outcomes were rewritten: unresolved",
    )
    canary_count: int = Field(3, ge=2, le=10, description="how many canaries per test run")
    recheck: bool = Field(
        True,
        description="a candidate the first run grades resolved has its "
        "graded tests (FAIL_TO_PASS and PASS_TO_PASS) run again in a fresh "
        "sandbox from pristine test files, each test's call observed (not "
        "its report); they must pass "
        "there too, else unresolved (pytest tasks with rollserve's own script)",
    )
    protected_files: Literal["drop", "fail"] = Field(
        "drop",
        description="changes to test infrastructure (conftest.py, pytest/tox/setup.cfg/"
        "pyproject config, tests folders, test runners, start-up hooks, packaging metadata, "
        "new root modules shadowing the stdlib or installed packages): left out of the "
        "patch that is graded, or the candidate gets 0",
    )
    machinery: Literal["fail", "flag", "off"] = Field(
        "fail",
        description="the scan of the candidate's non-test Python changes for what "
        "they add that reaches into test machinery (pytest/unittest internals, sys.modules, "
        "import hooks, frame and gc introspection, exit and trace hooks, obfuscation of "
        "those): fail (unresolved without running the tests), flag (graded as usual, the "
        "findings listed in the evaluation), off",
    )
    setup_timeout: float = Field(300.0, gt=0, description="seconds to materialise the repository")
    memory_mb: int = Field(4096, ge=256)
    pids: int = Field(512, ge=32)


def hidden_folders(options: SWEOptions) -> list[str]:
    """Host folders a host-mode sandbox must not see: the mirrors and the cut bundles
    (their history goes past other tasks' base_commit), the bundled suite (its gold
    patches), and in a source checkout of rollserve the suite's sources and the
    checkout's git history."""
    suite = SWE_MINI_BUNDLES.parent
    checkout = Path(__file__).resolve().parents[4]
    folders = [*options.mirrors, repo_cache(options), suite]
    if (checkout / "scripts" / "swe_mini").is_dir():
        folders += [checkout / "scripts" / "swe_mini", checkout / ".git"]
    return [str(Path(f).resolve()) for f in folders]


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
    if runtime_name in ("apptainer", "singularity") and "://" not in name and not name.endswith(".sif"):
        return f"docker://{name}"
    return name


# --- host mode: the repository from a bundle or a mirror -----------------------------
def source_names(task: SWETask) -> list[str]:
    """The names a bundle or mirror of ``task``'s repository may have in a folder."""
    owner, _, name = task.repo.partition("/")
    return [
        f"{task.instance_id}.bundle",
        f"{owner}__{name}.bundle",
        f"{owner}__{name}.git",
        f"{owner}/{name}.git",
        f"{owner}/{name}",
    ]


def find_source(task: SWETask, mirrors: list[Path]) -> Path:
    """The bundle or mirror that holds ``task``'s repository; InfraError naming every
    file it looked for if there is none."""
    folders = [*mirrors, SWE_MINI_BUNDLES]
    for folder in folders:
        for path in (folder / name for name in source_names(task)):
            if path.is_file() and path.suffix == ".bundle":
                return path
            if path.is_dir() and ((path / "HEAD").is_file() or (path / ".git").exists()):
                return path
    raise InfraError(
        f"no git bundle or mirror of {task.repo} for {task.instance_id}: looked for "
        f"{', '.join(source_names(task))} in {', '.join(map(str, folders))}; add "
        "one to the swe handler's 'mirrors', or run in image mode (apptainer)"
    )


_BUNDLE_LOCKS: dict[str, asyncio.Lock] = {}


def repo_cache(options: SWEOptions) -> Path:
    """Where cut bundles are kept (one task's cut may hold another's fix: a later
    base_commit of the same repository)."""
    return (options.repo_cache or Path.home() / ".cache" / "rollserve" / "swe-repos").resolve()


async def bundle_for(task: SWETask, options: SWEOptions) -> Path:
    """A bundle of ``task``'s repository cut at ``base_commit`` (made once per source
    and commit, then cached): a bundle as it is found may hold later commits."""
    commit = task.base_commit
    if not commit:  # (validation asks for it without an image runtime)
        raise InfraError(f"{task.instance_id}: no base_commit to cut the repository at")
    source = find_source(task, options.mirrors)
    cache = repo_cache(options)
    key = hashlib.sha256(f"{source.resolve()}@{commit}".encode()).hexdigest()[:16]
    target = cache / f"{task.repo.replace('/', '__')}-{commit[:12]}-{key}.bundle"
    lock = _BUNDLE_LOCKS.setdefault(str(target), asyncio.Lock())
    async with lock:
        if not target.is_file():
            await asyncio.to_thread(cut_bundle, source, commit, target)
    return target


def cut_bundle(source: Path, commit: str, target: Path) -> None:
    """The history up to ``commit`` of ``source`` (a bundle or a repository) as a bundle
    of one branch, ``main``, at ``target`` (atomic). Nothing else reaches it: a bundle
    holds exactly the objects reachable from the refs it is made of."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        clone = Path(tmp) / "repo"
        steps = [
            ["git", "clone", "-q", "--bare", "--no-local", str(source), str(clone)],
            ["git", "-C", str(clone), "update-ref", "refs/heads/main", f"{commit}^{{commit}}"],
            ["git", "-C", str(clone), "bundle", "create", "-q", str(Path(tmp) / "b"), "main"],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                what = (
                    f"commit {commit} is not in {source}"
                    if "update-ref" in argv
                    else f"could not cut {source} at {commit}"
                )
                raise InfraError(f"{what}: {' '.join(argv[:4])}: {done.stderr.strip()[-500:]}")
        os.replace(Path(tmp) / "b", target)


async def materialise(sandbox: Sandbox, task: SWETask, options: SWEOptions, bundle: Path) -> None:
    """Put the repository at ``base_commit`` in the workspace (host mode), from
    ``bundle_for``'s bundle."""
    await sandbox.write_file(BUNDLE_NAME, await asyncio.to_thread(bundle.read_bytes))
    base = task.base_commit
    # (Commands start in the workspace; the clone goes through a folder inside it, so
    # nothing is shared with other sandboxes even on the unconfined local runtime.)
    script = f"""set -e
git clone -q --no-checkout {BUNDLE_NAME} .rollserve-clone 2>&1
mv .rollserve-clone/.git .git
rm -rf .rollserve-clone {BUNDLE_NAME}
git checkout -q -f --detach {base}
git remote remove origin
rm -rf .git/logs
git config user.email agent@rollserve.local
git config user.name rollserve-agent
"""
    result = await sandbox.exec(script, timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(f"could not materialise {task.repo} at {base} from {bundle.name}: {result.failure(800)}")


# Image mode: the image's repository keeps its whole history (later commits, other
# branches, tags, the stash, reflogs, unreachable objects). Cut it as a bundle is cut:
# HEAD detached at base_commit, no refs, no remotes, no reflogs, and only the objects
# HEAD and the index reach (the working tree, untracked files included, is kept).
CUT_HISTORY = """set -e
git checkout -q --detach
git for-each-ref --format='option no-deref%0adelete %(refname)' | git update-ref --stdin
for remote in $(git remote); do git remote remove "$remote"; done
rm -rf .git/logs .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/refs/original .git/shallow
git reflog expire --expire=now --all
git repack -a -d -q
rm -f .git/objects/info/alternates
git prune --expire=now
git rev-parse HEAD
"""
R2E_TESTS = "/r2e_tests"  # R2E-Gym images' hidden tests: for EVAL only


async def prepare_image_repo(sandbox: Sandbox, options: SWEOptions) -> None:
    """Image mode: the workspace holds the image's repository (seeded at start); make
    git usable on it (ownership may differ from the image's) and cut its history at
    HEAD (``CUT_HISTORY``)."""
    # (Commands start in the workspace.)
    script = (
        "git config --global --add safe.directory '*' && "
        "git config --global user.email agent@rollserve.local && "
        "git config --global user.name rollserve-agent && git rev-parse HEAD"
    )
    result = await sandbox.exec(script, timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(f"the image's repository ({options.image_repo_dir}) is not a git checkout: {result.failure()}")
    result = await sandbox.exec(CUT_HISTORY, timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(f"could not cut the history of the image's repository: {result.failure()}")


async def hide_r2e_tests(sandbox: Sandbox, options: SWEOptions) -> None:
    """R2E-Gym, before RUN: remove the image's ``/r2e_tests`` from this sandbox (EVAL's
    fresh sandbox has it again); InfraError where the runtime does not let it go."""
    result = await sandbox.exec(f"rm -rf {R2E_TESTS}; test ! -e {R2E_TESTS}", timeout=options.setup_timeout)
    if not result.ok:
        raise InfraError(
            f"could not hide {R2E_TESTS} (the instance's hidden tests) from the "
            f"agent in this runtime: {result.failure()}"
        )


def git_available() -> str | None:
    """None if git is on PATH here, else why the host mode cannot work."""
    return None if shutil.which("git") else "git is not installed (apt-get install git)"

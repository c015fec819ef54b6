"""Runtimes for the sandbox tests (imported by test modules, so they also work with
``--noconftest``, as the escape suite does when it re-runs itself as another uid)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from rollserve.sandbox.config import DockerConfig, runtime_config
from rollserve.sandbox.registry import RUNTIMES as REGISTRY
from rollserve.sandbox.registry import AnyRuntime, new_runtime, unavailable_reason
from tests import early_start
from tests.waiting import eventually, wait_until  # noqa: F401 (the sandbox tests import them here)

REPO = Path(__file__).resolve().parents[2]
NESTED = "ROLLSERVE_UNPRIVILEGED_NESTED"  # set in a module re-run as another uid
NESTED_RUNTIMES = "ROLLSERVE_TEST_RUNTIMES"  # the runtimes a nested run tests
UNPRIVILEGED_UID = 65534
# The contract tests run on every runtime in the registry: a new runtime is tested by
# registering it. Each one that cannot run here is skipped with its reason. (A nested
# run as another uid tests only those its parent found running for that uid.)
RUNTIMES = os.environ[NESTED_RUNTIMES].split(",") if os.environ.get(NESTED_RUNTIMES) else list(REGISTRY)
# Runtimes whose daemon decides who may use them: a plain user may not, and that is no
# failure of rollserve's. Every other runtime that runs here must run as one too.
DAEMON_RUNTIMES = frozenset({"docker", "podman"})
# Image runtimes' sandboxes need an image with bash and python3. Tests pull nothing
# for docker/podman (the image must be there); apptainer builds it once, into a cache
# the tests share.
TEST_IMAGE = os.environ.get("ROLLSERVE_TEST_IMAGE", "python:3.12-slim")
_SIF = {
    "default_image": os.environ.get("ROLLSERVE_TEST_SIF", f"docker://{TEST_IMAGE}"),
    "image_cache": str(Path(tempfile.gettempdir()) / "rollserve-test-sif"),
}
TEST_OPTIONS: dict[str, dict[str, str]] = {
    "apptainer": _SIF,
    "singularity": _SIF,
    "docker": {"default_image": TEST_IMAGE},
    "podman": {"default_image": TEST_IMAGE},
}


@functools.cache
def cannot_run(name: str) -> str | None:
    """Why runtime ``name`` cannot run the contract tests here, or None."""
    config = runtime_config(name, TEST_OPTIONS.get(name))
    if reason := unavailable_reason(name, config):
        return f"{name}: {reason}"
    if isinstance(config, DockerConfig):
        base = [config.runtime, "--runtime", "runc"] if config.runtime == "podman" else [config.runtime]
        present = subprocess.run([*base, "image", "inspect", config.default_image], capture_output=True, timeout=60)
        if present.returncode != 0:
            return f"{name}: image {config.default_image} is not here (tests pull nothing)"
    return None


def make_runtime(name: str, state_dir: Path) -> AnyRuntime:
    """Runtime ``name`` as the contract tests use it; the test is skipped with the
    reason where it cannot run here."""
    if reason := cannot_run(name):
        pytest.skip(reason)
    return new_runtime(runtime_config(name, TEST_OPTIONS.get(name)), state_dir)


def _is_multiprocessing_helper(process: psutil.Process) -> bool:
    """multiprocessing's forkserver and resource tracker: started once by the first
    test that uses a process pool (the scoring pool) and kept for the whole test
    session by design; they are not sandbox processes."""
    try:
        return "from multiprocessing." in " ".join(process.cmdline())
    except psutil.Error:
        return False


def our_descendants() -> list[psutil.Process]:
    """Every process this test process started that is still around, except
    multiprocessing's session-long helpers and the commands the session started for a
    later test (tests/early_start.py: mypy runs, or has exited unreaped, meanwhile)."""
    session = early_start.pids()
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in session and not _is_multiprocessing_helper(p)
    ]


def processes_with(marker: str) -> list[psutil.Process]:
    """Processes this test started (sandboxes included) whose command line holds ``marker``."""
    found = []
    for process in our_descendants():
        try:
            if marker in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def rerun_unprivileged(test_file: str, tmp_path: Path) -> None:
    """Re-run ``test_file`` (but its ``unprivileged_user`` test) as uid 65534, through
    setpriv (no account to create): the server may run as a plain user, and its
    sandboxes then live in a user namespace of that uid instead of a uid of their own.
    Fails with the nested run's output; skips where that uid cannot read the checkout."""
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    os.chmod(tmp_path, 0o755)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TMPDIR": str(home),
        NESTED: "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }
    if "PYTHONPATH" in os.environ:  # (e.g. a work tree's sources before the installed ones)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    as_user = [
        "setpriv",
        f"--reuid={UNPRIVILEGED_UID}",
        f"--regid={UNPRIVILEGED_UID}",
        "--clear-groups",
        "--",
        sys.executable,
    ]
    probe = subprocess.run(
        [
            *as_user,
            "-c",
            "import json, rollserve, pytest, tests.sandbox.helpers "
            "as h; print(json.dumps({n: h.cannot_run(n) for n in h.RUNTIMES}))",
        ],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:  # e.g. a checkout under /root (mode 700)
        pytest.skip(
            f"uid {UNPRIVILEGED_UID} cannot read this checkout or its Python "
            f"({probe.stderr.strip()[-200:]}); run the suite as a plain user instead"
        )
    as_user_reasons = json.loads(probe.stdout.splitlines()[-1])
    runnable = [name for name in RUNTIMES if cannot_run(name) is None]
    lost = {
        name: as_user_reasons[name]
        for name in runnable
        if as_user_reasons[name] is not None and name not in DAEMON_RUNTIMES
    }
    assert not lost, f"runtimes that run here but not as uid {UNPRIVILEGED_UID}: {lost}"
    env[NESTED_RUNTIMES] = ",".join(name for name in runnable if as_user_reasons[name] is None)
    command = [
        *as_user,
        "-m",
        "pytest",
        test_file,
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-k",
        "not unprivileged_user",
    ]
    try:  # (within pytest's own 300 s, so that a stuck run shows its output)
        done = subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"") + (expired.stderr or b"")
        pytest.fail(f"the run as uid {UNPRIVILEGED_UID} took over 240 s:\n{output.decode(errors='replace')[-3000:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]

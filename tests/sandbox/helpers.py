"""Runtimes for the sandbox tests (imported by test modules, so they also work with
``--noconftest``, as the escape suite does when it re-runs itself as another uid)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.local import LocalRuntime

RUNTIMES = ["local", "bubblewrap"]
REPO = Path(__file__).resolve().parents[2]
NESTED = "ROLLSERVE_UNPRIVILEGED_NESTED"  # set in a module re-run as another uid
UNPRIVILEGED_UID = 65534


def make_runtime(name: str, state_dir, **config):
    if name == "local":
        return LocalRuntime(state_dir=state_dir)
    reason = BubblewrapRuntime.unavailable_reason()
    if reason:
        pytest.skip(f"bubblewrap runtime unavailable: {reason}")
    return BubblewrapRuntime(state_dir=state_dir)


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
    multiprocessing's session-long helpers."""
    return [p for p in psutil.Process().children(recursive=True)
            if not _is_multiprocessing_helper(p)]


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


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()



def rerun_unprivileged(test_file: str, tmp_path: Path) -> None:
    """Re-run ``test_file`` (but its ``unprivileged_user`` test) as uid 65534, through
    setpriv (no account to create): the server may run as a plain user, and its
    sandboxes then live in a user namespace of that uid instead of a uid of their own.
    Fails with the nested run's output; skips where that uid cannot read the checkout."""
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    os.chmod(tmp_path, 0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), NESTED: "1",
           "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:  # (e.g. a work tree's sources before the installed ones)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    as_user = ["setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}",
               "--clear-groups", "--", sys.executable]
    probe = subprocess.run([*as_user, "-c", "import rollserve, pytest, tests.sandbox.helpers"],
                           check=False, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:  # e.g. a checkout under /root (mode 700)
        pytest.skip(f"uid {UNPRIVILEGED_UID} cannot read this checkout or its Python "
                    f"({probe.stderr.strip()[-200:]}); run the suite as a plain user instead")
    command = [*as_user, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider",
               "--noconftest", "-k", "not unprivileged_user"]
    try:  # (within pytest's own 300 s, so that a stuck run shows its output)
        done = subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"") + (expired.stderr or b"")
        pytest.fail(f"the run as uid {UNPRIVILEGED_UID} took over 240 s:\n"
                    f"{output.decode(errors='replace')[-3000:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]

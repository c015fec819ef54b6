"""Runtimes for the sandbox tests (imported by test modules, so they also work with
``--noconftest``, as the escape suite does when it re-runs itself as another uid)."""

from __future__ import annotations

import time

import psutil
import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.local import LocalRuntime

RUNTIMES = ["local", "bubblewrap"]


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


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


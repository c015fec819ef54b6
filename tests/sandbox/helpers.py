"""Runtimes for the sandbox tests (imported by test modules, so they also work with
``--noconftest``, as the escape suite does when it re-runs itself as another uid)."""

from __future__ import annotations

import os
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


def our_descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def is_root() -> bool:
    return os.geteuid() == 0

"""Sandboxes for the tool tests: every behavioural test runs on each runtime here."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxSpec

RUNTIMES = ["local", "bubblewrap"]


def make_runtime(name: str, state_dir):
    if name == "local":
        from rollserve.sandbox.local import LocalRuntime

        return LocalRuntime(state_dir=state_dir)
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime

    reason = BubblewrapRuntime.unavailable_reason()
    if reason:
        pytest.skip(f"bubblewrap runtime unavailable: {reason}")
    return BubblewrapRuntime(state_dir=state_dir)


@pytest.fixture(params=RUNTIMES)
async def sandbox(request, tmp_path):
    runtime = make_runtime(request.param, tmp_path / "state")
    box = await runtime.start(SandboxSpec())
    yield box
    await box.close()

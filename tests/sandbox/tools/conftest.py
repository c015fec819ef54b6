"""Sandboxes for the tool tests: every behavioural test runs on each runtime here."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxSpec
from tests.sandbox.helpers import RUNTIMES, make_runtime


@pytest.fixture(params=RUNTIMES)
async def sandbox(request, tmp_path):
    runtime = make_runtime(request.param, tmp_path / "state")
    box = await runtime.start(SandboxSpec())
    yield box
    await box.close()

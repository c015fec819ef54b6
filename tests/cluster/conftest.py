"""Fixtures of the cluster tests with fake worker actors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The actors the head kills (ray.kill takes only real handles)."""
    calls = pytest.importorskip("rollserve.cluster.calls", reason="Ray is not installed")
    kills: list[Any] = []
    monkeypatch.setattr(calls, "kill", kills.append)
    return kills


@pytest.fixture
async def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A started node worker (the smollm2 tokenizer, one scoring worker), stopped after."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")
    from rollserve.cluster.protocol import WorkerSettings
    from rollserve.cluster.worker import NodeWorker

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = WorkerSettings(node="n1", state_dir=tmp_path, tokenizer="smollm2", scoring_workers=1)
    w = NodeWorker(settings.model_dump_json())
    await w.start()
    try:
        yield w
    finally:
        await asyncio.wait_for(w.stop(), 60)

"""Fixtures of the cluster tests with fake worker actors."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The actors the head kills (ray.kill takes only real handles)."""
    calls = pytest.importorskip("rollserve.cluster.calls", reason="Ray is not installed")
    kills: list[Any] = []
    monkeypatch.setattr(calls, "kill", kills.append)
    return kills

"""A rollout seen with the task's own agent time limit (``[agent].timeout_sec``): its
agent deadline is the earlier of the rollout's and the task's, so the tool loop or the
harness ends itself in time (``time_limit``), charged to the agent."""

from __future__ import annotations

import asyncio
from typing import Any

from rollserve.handlers.base import RolloutView


class Bounded:
    """``rollout``, with ``agent_deadline`` at most ``seconds`` from now (None: as is)."""

    def __init__(self, rollout: RolloutView, seconds: float | None) -> None:
        self._rollout = rollout
        self._end = None if seconds is None else asyncio.get_running_loop().time() + seconds

    def agent_deadline(self, now: float) -> float | None:
        deadline = self._rollout.agent_deadline(now)
        if self._end is None:
            return deadline
        return self._end if deadline is None else min(deadline, self._end)

    def seconds_left(self, default: float) -> float:
        """Seconds to the agent deadline (``default`` where there is none), at least 1."""
        now = asyncio.get_running_loop().time()
        deadline = self.agent_deadline(now)
        return default if deadline is None else max(1.0, deadline - now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rollout, name)

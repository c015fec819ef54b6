"""What the router knows about each backend: health, load and a speed estimate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollserve.llm.base import BackendKind, LLMBackend

EWMA_ALPHA = 0.2  # weight of the newest sample in the speed estimate


@dataclass(eq=False)
class BackendState:
    backend: LLMBackend
    weight: float = 1.0
    healthy: bool = True
    draining: bool = False  # finish what is in flight, take nothing new
    removed: bool = False
    outstanding: int = 0  # requests in flight through the router
    sessions: int = 0  # trajectories pinned here now
    assigned: int = 0  # trajectories ever pinned here (ProRL's count)
    calls: int = 0
    failures: int = 0
    # Seconds of latency per request in flight, averaged (EWMA): about 1/throughput
    # on a busy server, so (outstanding + 1) x unit_cost estimates a new request's wait.
    unit_cost: float | None = None
    health_failures: int = 0  # consecutive failed health probes
    next_check: float = 0.0  # loop time of the next health probe
    last_error: str | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def usable(self) -> bool:
        """May take new requests."""
        return self.healthy and not self.draining and not self.removed

    @property
    def trainable(self) -> bool:
        return self.backend.trainable

    def serves(self, kind: BackendKind) -> bool:
        """``tokens``: samples from token ids (trainable); ``messages``: a message-level
        chat API (``LLMBackend.chat``)."""
        return not self.trainable if kind == "messages" else self.trainable

    def record_success(self, seconds: float, concurrency: int) -> None:
        self.calls += 1
        sample = seconds / max(concurrency, 1)
        self.unit_cost = sample if self.unit_cost is None else ((1 - EWMA_ALPHA) * self.unit_cost + EWMA_ALPHA * sample)

    def record_failure(self, message: str) -> None:
        self.calls += 1
        self.failures += 1
        self.last_error = message

    def snapshot(self) -> dict[str, Any]:
        info = dict(self.backend.describe())
        info.update(
            healthy=self.healthy,
            draining=self.draining,
            outstanding=self.outstanding,
            sessions=self.sessions,
            assigned=self.assigned,
            weight=self.weight,
            calls=self.calls,
            failures=self.failures,
            unit_cost_ms=None if self.unit_cost is None else round(self.unit_cost * 1000, 3),
            last_error=self.last_error,
        )
        return info

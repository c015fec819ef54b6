"""How busy a server is: time with work in flight, and slot-seconds used."""

from __future__ import annotations

import time


class LoadMeter:
    """Integrates the number of requests in flight over time.

    ``busy_seconds`` is the wall time with at least one request in flight;
    ``slot_seconds`` is the integral of the in-flight count (divide by wall time x
    capacity for utilization).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self, in_flight: int = 0) -> None:
        now = time.perf_counter()
        self.since = now
        self._last = now
        self.in_flight = in_flight
        self.max_in_flight = in_flight
        self.busy_seconds = 0.0
        self.slot_seconds = 0.0

    def _advance(self) -> float:
        now = time.perf_counter()
        dt = now - self._last
        if self.in_flight:
            self.busy_seconds += dt
            self.slot_seconds += dt * self.in_flight
        self._last = now
        return now

    def enter(self) -> None:
        self._advance()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        self._advance()
        self.in_flight -= 1

    def snapshot(self) -> dict[str, float]:
        now = self._advance()
        return {
            "wall_seconds": now - self.since,
            "busy_seconds": self.busy_seconds,
            "slot_seconds": self.slot_seconds,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }

"""Routing policies: which backend a trajectory goes to, and when it moves.

A policy answers two questions: ``pick`` — the backend for a trajectory that has
none (its first call, or its backend is gone); ``keep`` — whether a pinned
trajectory stays where its prefix is cached for its next call.

``LeastLoad`` is rollserve's policy. The others are the baselines the routing
benchmark compares against (``benchmarks/routing.py``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from typing import Protocol

from rollserve.llm.routing.backend_state import BackendState


class Policy(Protocol):
    name: str

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState: ...

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool: ...


class LeastLoad:
    """Least expected wait, sticky unless the pinned backend is clearly worse.

    A backend's expected wait for one more request is ``(outstanding + 1) x
    unit_cost / weight``, where ``unit_cost`` (seconds of latency per request in
    flight, measured) is about the inverse of its throughput: a backend twice as
    slow fills to half the depth. Before any measurement every backend counts the
    same, so this starts as least-outstanding (weighted).

    A pinned trajectory moves when its backend's expected wait exceeds the best
    one's by ``rebalance_factor`` and by ``rebalance_slack`` requests' worth: the
    prefix cache is worth keeping, but not behind a queue.
    """

    name = "least_load"

    def __init__(self, rebalance_factor: float = 1.5, rebalance_slack: float = 2.0):
        self.rebalance_factor = rebalance_factor
        self.rebalance_slack = rebalance_slack

    @staticmethod
    def _unit(state: BackendState, default: float) -> float:
        return state.unit_cost if state.unit_cost is not None else default

    @staticmethod
    def _default_unit(states: Sequence[BackendState]) -> float:
        known = [s.unit_cost for s in states if s.unit_cost is not None]
        return sum(known) / len(known) if known else 1.0

    def wait(self, state: BackendState, default: float) -> float:
        return (state.outstanding + 1) * self._unit(state, default) / state.weight

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState:
        default = self._default_unit(candidates)
        return min(candidates, key=lambda s: (self.wait(s, default), s.sessions / s.weight, s.assigned / s.weight))

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool:
        others = [s for s in candidates if s is not pinned]
        if not others:
            return True
        default = self._default_unit(candidates)
        best = min(others, key=lambda s: self.wait(s, default))
        best_wait = self.wait(best, default)
        slack = self.rebalance_slack * self._unit(best, default) / best.weight
        # The request would leave ``pinned`` for ``best``: compare the waits it would see.
        return self.wait(pinned, default) <= self.rebalance_factor * best_wait + slack


class LeastOutstanding:
    """Fewest requests in flight for a new trajectory; sticky forever (no speed estimate)."""

    name = "least_outstanding"

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState:
        return min(candidates, key=lambda s: (s.outstanding / s.weight, s.sessions / s.weight))

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool:
        return True


class CumulativeCount:
    """ProRL Agent's: a min-heap of assignments ever made per server; no load awareness."""

    name = "prorl_cumulative"

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState:
        return min(candidates, key=lambda s: s.assigned)

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool:
        return True


class RoundRobin:
    """Each new trajectory to the next backend in turn; sticky."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState:
        ordered = sorted(candidates, key=lambda s: s.name)
        return ordered[next(self._turn) % len(ordered)]

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool:
        return True


class HashSticky:
    """A trajectory's key hashed onto the backends (stable across calls); sticky."""

    name = "hash_sticky"

    def pick(self, candidates: Sequence[BackendState], key: str) -> BackendState:
        ordered = sorted(candidates, key=lambda s: s.name)
        return ordered[zlib.crc32(key.encode()) % len(ordered)]

    def keep(self, pinned: BackendState, candidates: Sequence[BackendState]) -> bool:
        return True


POLICIES = {p.name: p for p in (LeastLoad, LeastOutstanding, CumulativeCount, RoundRobin, HashSticky)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"policy: unknown routing policy {name!r}; expected one of {', '.join(POLICIES)}") from None

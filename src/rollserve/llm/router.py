"""The router: which inference backend serves each trajectory.

A trajectory's session picks a backend at its first call and keeps it, so a
multi-turn conversation keeps hitting the server that holds its prefix in cache.
The pick is the healthy backend with the fewest outstanding requests. With no
backend registered, a call waits until one is added: the caller bounds that wait
with its own deadline, like every other wait in a rollout.

(Health probing, draining and pause/resume around weight updates come later.)
"""

from __future__ import annotations

import asyncio
import logging

from rollserve.errors import LLMError
from rollserve.llm.base import Generation, LLMBackend, SamplingParams

log = logging.getLogger(__name__)


class Router:
    """Backends by name, with per-backend outstanding-request counts."""

    def __init__(self, policy_version: int | None = None):
        self.policy_version: int | None = policy_version
        self._backends: dict[str, LLMBackend] = {}
        self._healthy: dict[str, bool] = {}
        self._outstanding: dict[str, int] = {}
        self._assigned: dict[str, int] = {}  # sessions ever pinned here: the tie-breaker
        self._changed = asyncio.Event()

    # --- registry ------------------------------------------------------------------
    def add(self, backend: LLMBackend) -> None:
        if backend.name in self._backends:
            raise ValueError(f"name: a backend named {backend.name!r} is already registered")
        self._backends[backend.name] = backend
        self._healthy[backend.name] = True
        self._outstanding.setdefault(backend.name, 0)
        self._assigned.setdefault(backend.name, 0)
        self._notify()

    async def remove(self, name: str, close: bool = True) -> LLMBackend:
        """Unregister ``name``; sessions pinned to it pick again at their next call."""
        backend = self._backends.pop(name, None)
        if backend is None:
            raise KeyError(name)
        self._healthy.pop(name, None)
        self._assigned.pop(name, None)
        if close:
            await backend.close()
        return backend

    def get(self, name: str) -> LLMBackend:
        return self._backends[name]

    def list(self) -> list[dict]:
        out = []
        for name, backend in self._backends.items():
            info = dict(backend.describe())
            info["healthy"] = self._healthy[name]
            info["outstanding"] = self._outstanding.get(name, 0)
            out.append(info)
        return out

    def set_healthy(self, name: str, healthy: bool) -> None:
        """Mark a backend (un)healthy; unhealthy ones get no new sessions."""
        if name not in self._backends:
            raise KeyError(name)
        self._healthy[name] = healthy
        if healthy:
            self._notify()

    def is_healthy(self, name: str) -> bool:
        """Registered and not marked unhealthy."""
        return self._healthy.get(name, False)

    def outstanding(self, name: str) -> int:
        return self._outstanding.get(name, 0)

    def session(self, key: str = "") -> "RouterSession":
        return RouterSession(self, key)

    # --- picking and calling ------------------------------------------------------------
    def _candidates(self, exclude: str | None = None) -> list[str]:
        return [n for n in self._backends if self._healthy[n] and n != exclude]

    def pick(self, exclude: str | None = None) -> str | None:
        """The healthy backend with the fewest outstanding requests (None if none)."""
        names = self._candidates(exclude)
        if not names:
            return None
        return min(names, key=lambda n: (self._outstanding[n], self._assigned[n]))

    async def wait_for_backend(self) -> str:
        """Pick a backend, waiting (no polling) until one is added if there is none."""
        while True:
            name = self.pick()
            if name is not None:
                return name
            changed = self._changed
            await changed.wait()

    def _notify(self) -> None:
        # Wake every waiter, then arm a fresh event for the next wait.
        self._changed.set()
        self._changed = asyncio.Event()

    async def call(self, name: str, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        backend = self._backends[name]
        self._outstanding[name] += 1
        try:
            gen = await backend.generate(prompt_ids, sampling)
        finally:
            self._outstanding[name] -= 1
        if not gen.backend:
            gen.backend = name
        return gen


class RouterSession:
    """A sticky handle for one trajectory (implements ``agent.loop.LLMSession``)."""

    def __init__(self, router: Router, key: str = ""):
        self.router = router
        self.key = key
        self.backend: str | None = None  # pinned at the first call

    @property
    def policy_version(self) -> int | None:
        return self.router.policy_version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        router = self.router
        if self.backend is None or not router.is_healthy(self.backend):
            # First call, or the pinned backend was removed or marked unhealthy.
            self.backend = await router.wait_for_backend()
            router._assigned[self.backend] += 1
        try:
            return await router.call(self.backend, prompt_ids, sampling)
        except LLMError as first:
            retry = router.pick(exclude=self.backend)
            if retry is None:
                raise
            log.warning("session %s: %s failed (%s); retrying on %s",
                        self.key, self.backend, first, retry)
            self.backend = retry  # stay on the one that works
            router._assigned[retry] += 1
            return await router.call(retry, prompt_ids, sampling)

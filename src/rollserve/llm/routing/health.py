"""Health checks: one background task per router, probing each backend on a schedule.

A healthy backend is probed every ``interval`` seconds. A failed probe marks it
unhealthy at once (the router gives it no new requests and its trajectories move
at their next call) and later probes back off exponentially (``backoff_base`` x
2^k, at most ``backoff_max``) until one succeeds. A call that fails on a backend
asks for an immediate probe (``poke``), so a dead server is noticed in
milliseconds, not at the next interval.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, Field

from rollserve.llm.routing.backend_state import BackendState
from rollserve.llm.routing.base import HealthTarget

log = logging.getLogger(__name__)


class HealthConfig(BaseModel):
    interval: float = Field(5.0, gt=0, description="seconds between probes of a healthy backend")
    timeout: float = Field(5.0, gt=0, description="seconds a probe may take")
    backoff_base: float = Field(0.5, gt=0, description="first re-probe of an unhealthy backend")
    backoff_max: float = Field(30.0, gt=0, description="longest wait between re-probes")


class HealthMonitor:
    def __init__(self, router: HealthTarget, config: HealthConfig):
        self.router = router
        self.config = config
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if not self.running:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="rollserve-llm-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def poke(self, state: BackendState) -> None:
        """Probe ``state`` now (a call on it just failed)."""
        if self.running and self._wake is not None:
            state.next_check = 0.0
            self._wake.set()

    async def check(self, state: BackendState) -> bool:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.config.timeout):  # (not wait_for: see _loop)
                ok = bool(await state.backend.health())
        except Exception as exc:  # a probe that raises is a failed probe
            log.debug("health probe of %s raised %r", state.name, exc)
            ok = False
        if state.removed:
            return ok
        if ok:
            if not state.healthy:
                log.warning("backend %s is healthy again", state.name)
            state.health_failures = 0
            state.next_check = loop.time() + self.config.interval
            self.router.set_healthy(state.name, True)
        else:
            state.health_failures += 1
            delay = min(self.config.backoff_max, self.config.backoff_base * 2 ** (state.health_failures - 1))
            state.next_check = loop.time() + delay
            if state.healthy:
                log.warning("backend %s failed its health check; no new requests until it recovers", state.name)
                self.router.set_healthy(state.name, False)
        return ok

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()  # before looking: a poke from now on wakes the wait below
            now = loop.time()
            states = self.router.states()
            due = [s for s in states if s.next_check <= now]
            if due:
                await asyncio.gather(*(self.check(s) for s in due))
                continue
            wait = min((s.next_check for s in states), default=now + self.config.interval) - now
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for returns the wait's result
                # when a poke and stop()'s cancel race, and the cancel is lost.
                async with asyncio.timeout(max(wait, 0.01)):
                    await self._wake.wait()
            except TimeoutError:
                pass

"""An episode's time: what the LLM and the tools took, and who is charged at its end.

The engine gives the loop a time limit (``deadline``, event-loop time): the RUN
stage's deadline less a margin kept for what comes after the episode (taking the
patch or solution, EVAL). At the limit the loop ends the episode itself, so a policy
cannot turn its own stalling (``sleep`` in a tool until the rollout times out) into
a masked timeout. Who took the time decides what the end is:

- the agent's tools took at least as long as everything else in the episode
  (waiting on the LLM backend, rendering prompts) together: the episode ends
  ``time_limit`` and the rollout goes on to EVAL and is scored;
- else the infrastructure made it late (a slow or hung backend): ``DeadlineFailure``,
  masked, the rollout ``timed_out``; the same when nothing was sampled yet.

A step (the tools) running at the limit is cancelled there and the env's tools are
told to stop what they still run (``AgentEnv.stop``, bounded by ``STOP_SECONDS``);
an LLM call running at the limit is cancelled there too (its tokens were never
returned, so nothing of it is kept).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from rollserve.errors import DeadlineFailure

if TYPE_CHECKING:
    from rollserve.agent.base import AgentEnv
    from rollserve.agent.trajectory import Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")
STOP_SECONDS = 5.0  # the most the env's tools get to stop what they run at the limit


@dataclass
class LoopStats:
    llm_seconds: float = 0.0
    env_seconds: float = 0.0


class TimeUp(Exception):
    """The episode's time limit passed (inside the loop only)."""


class EpisodeClock:
    """Times the LLM calls and the steps of one episode against its time limit."""

    def __init__(self, deadline: float | None, stats: LoopStats) -> None:
        self.deadline = deadline
        self.stats = stats
        self.started = time.perf_counter()

    def expired(self) -> bool:
        return self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline

    async def llm(self, call: Awaitable[T]) -> T:
        """``call`` (an LLM request), cancelled at the limit (``TimeUp``); its time is
        the infrastructure's."""
        started = time.perf_counter()
        try:
            return await self._bounded(call)
        finally:
            self.stats.llm_seconds += time.perf_counter() - started

    async def step(self, call: Awaitable[T]) -> T:
        """``call`` (the env's answer: the tools), cancelled at the limit (``TimeUp``);
        its time is the agent's."""
        started = time.perf_counter()
        try:
            return await self._bounded(call)
        finally:
            self.stats.env_seconds += time.perf_counter() - started

    async def _bounded(self, call: Awaitable[T]) -> T:
        if self.deadline is None:
            return await call
        try:
            async with asyncio.timeout_at(self.deadline) as limit:
                return await call
        except TimeoutError:
            if limit.expired():
                raise TimeUp() from None
            raise

    def end(self, trajectory: Trajectory) -> Literal["time_limit"]:
        """At the limit: ``"time_limit"`` when the agent's tools took the time (the
        episode is scored); else raise ``DeadlineFailure`` (masked)."""
        elapsed = time.perf_counter() - self.started
        tools, llm = self.stats.env_seconds, self.stats.llm_seconds
        took = f"{elapsed:.1f} s: {llm:.1f} s waiting on the LLM backend, {tools:.1f} s in the agent's tools"
        if not trajectory.turns:
            raise DeadlineFailure(f"the RUN deadline came before the policy sampled anything ({took})")
        if tools >= elapsed - tools:
            return "time_limit"
        raise DeadlineFailure(
            f"the RUN deadline came after {took}; the backend took most of the time, so the episode is not scored"
        )


async def stop_env(env: AgentEnv) -> None:
    """Tell ``env`` to stop what its tools still run (bounded; what is left is killed
    when the handler closes the sandbox)."""
    try:
        async with asyncio.timeout(STOP_SECONDS):
            await env.stop()
    except TimeoutError:
        log.warning("the env's tools did not stop within %g s at the time limit", STOP_SECONDS)
    except Exception:  # the sandbox close kills it anyway
        log.exception("stopping the env's tools at the time limit failed")

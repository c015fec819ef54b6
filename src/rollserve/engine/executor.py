"""Where a rollout's stage work runs: the seam between the pipeline (this process:
pools, deadlines, retries, the store) and a handler's work (sandboxes, the agent
loop, scoring). The pipeline calls ``reserve`` before each attempt's INIT, then each
stage, then ``cleanup`` once per attempt.

``LocalExecutor`` runs a stage's handler call in this process, as rollserve always
has; it is the default. ``rollserve.cluster.RayExecutor`` runs it in a worker actor
on a Ray node and copies back what the pipeline stores. The pipeline calls a stage
inside the stage's deadline and the rollout's (``llm.routing.deadline``), so an
executor bounds its own waits by ``current_deadline()``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from rollserve.contract import NodeStatus, Stage
from rollserve.engine.rollout import Rollout
from rollserve.handlers.base import AgentHandler, evaluate
from rollserve.llm.base import LLMSession

log = logging.getLogger(__name__)

CLEANUP_TIMEOUT = 30.0


class EngineSession(LLMSession, Protocol):
    """A rollout's sticky LLM session, as the engine holds it: closed at cleanup."""

    def close(self) -> None: ...


class Sessions(Protocol):
    """Where a rollout gets its sticky LLM session (``llm.routing.Router``)."""

    def session(self, key: str) -> EngineSession | None: ...


class StageExecutor(Protocol):
    """Runs one stage of a rollout's handler work and releases what it took."""

    async def reserve(self, r: Rollout) -> None:
        """Before each attempt's INIT (before INIT's pool slot and its stage timeout):
        wait for a place for the attempt to run (a cluster node's slot). The caller
        bounds the wait (the rollout's deadline); a cancel while waiting takes nothing,
        and what was reserved is released by ``cleanup``."""

    async def run_stage(self, r: Rollout, handler: AgentHandler, stage: Stage) -> None:
        """Run ``stage``; on return ``r`` holds what it produced (trajectory after RUN,
        reward and evaluation after EVAL). Raises the handler's typed failures."""

    async def cleanup(self, r: Rollout, handler: AgentHandler) -> None:
        """Release everything the rollout's stages took; bounded, never raises."""

    def nodes(self) -> list[NodeStatus] | None:
        """Per-node slots, queues and sandboxes (None: everything runs here)."""

    async def drain(self, name: str, draining: bool) -> list[NodeStatus]:
        """Stop (``draining``) or resume placing new rollouts on the node ``name``; its
        rollouts finish. Raises KeyError when there is no such node."""


class LocalExecutor:
    """The handler's calls in this process (single machine: the default)."""

    def __init__(self, router: Sessions) -> None:
        self.router = router

    async def reserve(self, r: Rollout) -> None:
        return None  # one machine: the stage pools are the only queue

    async def run_stage(self, r: Rollout, handler: AgentHandler, stage: Stage) -> None:
        if stage == "init":
            await handler.init(r)
        elif stage == "run":
            r.llm = self.router.session(r.id)
            await handler.run(r)
        else:
            r.scored(await evaluate(handler, r))

    async def cleanup(self, r: Rollout, handler: AgentHandler) -> None:
        """Release what the handler took; bounded, and shielded from cancellation."""
        try:
            await asyncio.shield(asyncio.wait_for(handler.cleanup(r), CLEANUP_TIMEOUT))
        except Exception:  # cleanup problems are logged, never mask the result
            log.exception("cleanup of rollout %s failed", r.id)
        if r.llm is not None:
            r.llm.close()

    def nodes(self) -> list[NodeStatus] | None:
        return None

    async def drain(self, name: str, draining: bool) -> list[NodeStatus]:
        raise KeyError(name)  # one machine: no nodes

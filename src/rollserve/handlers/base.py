"""The AgentHandler contract: one per task family, registered by ``name``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    from rollserve.engine.rollout import Rollout
    from rollserve.handlers.scoring import ScoringPool
    from rollserve.llm.base import Tokenizer
    from rollserve.sandbox.base import Runtime
    from rollserve.sandbox.registry import LazyRuntime


class HandlerDefaults(BaseModel):
    """Limits a handler uses when a request leaves them unset."""

    max_turns: int = 3
    max_context_tokens: int = 2048
    init_timeout: float = 60.0
    run_timeout: float = 600.0
    eval_timeout: float = 60.0
    total_timeout: float = 1800.0


@dataclass
class Evaluation:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class HandlerContext:
    """What the engine lends every handler.

    ``sandboxes`` starts sandboxes (``await ctx.sandboxes.start(spec)``): the server's
    runtime, created on first use (``sandbox.registry.LazyRuntime``), or None where
    the server has none. A handler that needs one and cannot get it fails the
    rollout with a ``SandboxError`` (infra: masked). Every sandbox a handler starts
    must be closed in its ``cleanup`` (see ``handlers.sandboxed``).
    """

    tokenizer: "Tokenizer"
    scoring: "ScoringPool"
    sandboxes: "LazyRuntime | Runtime | None" = None
    # Per-handler settings from the server (``rollserve serve --handler-options``):
    # handler name -> its options; each handler validates its own.
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


class InvalidInstance(ValueError):
    """A task instance does not fit its handler; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@runtime_checkable
class AgentHandler(Protocol):
    name: str
    defaults: HandlerDefaults

    def validate(self, instance: dict[str, Any]) -> None:
        """Raise InvalidInstance naming the field if ``instance`` cannot run."""

    async def init(self, rollout: "Rollout") -> None:
        """Prepare the task (sandbox up, data ready)."""

    async def run(self, rollout: "Rollout") -> None:
        """The agent loop; fills ``rollout.trajectory``."""

    async def eval(self, rollout: "Rollout") -> Evaluation:
        """Score the episode."""

    async def cleanup(self, rollout: "Rollout") -> None:
        """Release everything ``init``/``run`` took; always called, even on cancel."""

    # Optional: ``images(instance) -> list[str]``, the environment images (apptainer /
    # docker references) an instance runs in, for ``rollserve images pull``. A handler
    # without it needs no images.

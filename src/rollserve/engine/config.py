"""The engine's settings (stage pool sizes, admission, restarts, retention, staleness),
and what one rollout runs under: its spec's limits, else its handler's defaults."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rollserve.contract import Timeouts
from rollserve.engine.rollout import Rollout, RolloutSpec, default_run_margin
from rollserve.handlers.base import HandlerDefaults

__all__ = ["EngineConfig", "new_rollout"]


class EngineConfig(BaseModel):
    init_workers: int = Field(32, ge=1)
    run_workers: int = Field(256, ge=1)
    eval_workers: int = Field(16, ge=1)
    max_pending: int = Field(10_000, ge=1, description="rollouts admitted and not yet finished")
    on_restart: str = Field("requeue", pattern="^(requeue|interrupt)$")
    max_attempts: int = Field(3, ge=1, description="runs of one rollout across restarts")
    retention_s: float = Field(7 * 86_400, gt=0)
    max_staleness: int | None = Field(
        None, ge=0, description="flag a rollout whose turns span more policy versions than this"
    )
    mask_stale: bool = Field(False, description="mask (do not train on) flagged stale rollouts")


def new_rollout(spec: RolloutSpec, attempt: int, defaults: HandlerDefaults, config: EngineConfig) -> Rollout:
    """A rollout of ``spec``: its turn, context and stage limits, else the handler's defaults."""
    d = defaults
    t = spec.timeouts
    run = t.run or d.run_timeout
    return Rollout(
        spec=spec,
        attempt=attempt,
        max_staleness=config.max_staleness,
        mask_stale=config.mask_stale,
        max_turns=spec.agent.max_turns or d.max_turns,
        max_context_tokens=spec.agent.max_context_tokens or d.max_context_tokens,
        timeouts=Timeouts(
            init=t.init or d.init_timeout,
            run=run,
            eval=t.eval or d.eval_timeout,
            total=t.total or d.total_timeout,
            run_margin=t.run_margin or default_run_margin(run),
        ),
    )

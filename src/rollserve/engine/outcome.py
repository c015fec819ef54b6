"""How a rollout ends: the status and typed failure an error, a stage timeout or the
rollout's deadline give it, where a stored one stood, and what its result adds to the
engine's counters."""

from __future__ import annotations

from typing import Literal

from rollserve.contract import STAGES, Failure, RolloutResult, Stage, Timeouts, TrajectoryCounters
from rollserve.engine.rollout import Rollout
from rollserve.errors import DeadlineFailure, NodeLost, RolloutError

__all__ = ["StageTimeout", "end_with_error", "mask_kind", "stage_limit", "stage_of", "tally"]

Where = Stage | Literal["queue"]


class StageTimeout(Exception):
    """A stage ran past its own timeout (the rollout's deadline had not come)."""


def end_with_error(r: Rollout, stage: Where, exc: Exception) -> None:
    """End ``r`` with what ``exc``, raised in ``stage``, makes of it: a lost node it gave
    up on, a typed rollout error, a stage timeout, or a handler bug (an infra failure)."""
    if isinstance(exc, NodeLost):
        r.status = "failed"
        r.failure = Failure(stage=stage, kind="infra", message=(f"{exc.message}; gave up after {r.attempt} attempts"))
    elif isinstance(exc, RolloutError):
        # The RUN deadline, come while the backend had the time: as a timeout.
        r.status = "timed_out" if isinstance(exc, DeadlineFailure) else "failed"
        r.failure = Failure(stage=stage, kind=exc.kind, message=exc.message)
        if exc.kind == "agent":
            r.reward = 0.0
    elif isinstance(exc, StageTimeout):
        r.status = "timed_out"
        r.failure = Failure(stage=stage, kind="timeout", message=str(exc))
    else:
        r.status = "failed"
        r.failure = Failure(stage=stage, kind="infra", message=f"{type(exc).__name__}: {exc}")


def tally(counters: TrajectoryCounters, r: Rollout, result: RolloutResult) -> None:
    """Add a finished rollout's token-fidelity, truncation, staleness and token counts."""
    traj = r.trajectory
    counters.fidelity_mismatches += traj.fidelity.mismatches
    counters.rollouts_with_mismatches += traj.fidelity.mismatches > 0
    counters.truncated_turns += traj.truncated_turns
    counters.stale += r.stale
    counters.not_trainable += not traj.trainable
    counters.prompt_tokens += result.stats.prompt_tokens
    counters.output_tokens += result.stats.output_tokens


def mask_kind(r: Rollout) -> tuple[str, str]:
    """Why a masked rollout is masked, and where: ``("infra" | "timeout", stage)``, or
    ``("stale", "run")`` for turns of too many policy versions."""
    if r.failure is not None and r.failure.kind in ("infra", "timeout"):
        return r.failure.kind, r.failure.stage
    return "stale", "run"


def stage_limit(timeouts: Timeouts, stage: Stage) -> float | None:
    return {"init": timeouts.init, "run": timeouts.run, "eval": timeouts.eval}[stage]


def stage_of(status: str) -> Where:
    """Where a rollout stored as ``status`` stood: a stage, else still queued."""
    for stage in STAGES:
        if status == stage:
            return stage
    return "queue"

"""What a starting engine does with each rollout a previous server left unfinished:
re-queue it, end it interrupted, or end it cancelled (an extra whose over-sampling group
already had its n usable samples)."""

from __future__ import annotations

from typing import Literal

from rollserve.contract import Failure, RolloutStatus
from rollserve.engine.config import EngineConfig
from rollserve.engine.groups import EARLY_STOP_MESSAGE, OutcomeSource, needs_no_rerun
from rollserve.engine.outcome import stage_of
from rollserve.engine.store import RolloutRow

__all__ = ["Verdict", "ending", "verdict"]

# Named as the counts of ``contract.Recovered``.
Verdict = Literal["requeued", "interrupted", "cancelled"]


async def verdict(store: OutcomeSource, row: RolloutRow, config: EngineConfig) -> Verdict:
    if await needs_no_rerun(store, row.spec):
        # An extra whose group had its n usable samples when the server stopped: ended
        # as the early stop would have, never run again.
        return "cancelled"
    if config.on_restart == "requeue" and row.attempt + 1 <= config.max_attempts:
        return "requeued"
    return "interrupted"


def ending(
    verdict: Literal["interrupted", "cancelled"], row: RolloutRow, config: EngineConfig
) -> tuple[RolloutStatus, Failure]:
    """The status and failure an unfinished rollout not re-run ends with."""
    if verdict == "cancelled":
        return "cancelled", Failure(stage=stage_of(row.status), kind="infra", message=EARLY_STOP_MESSAGE)
    why = (
        f"gave up after {row.attempt} attempts"
        if config.on_restart == "requeue"
        else "the rollout was not re-run (on_restart=interrupt)"
    )
    return "interrupted", Failure(
        stage=stage_of(row.status),
        kind="infra",
        message=f"server stopped while the rollout was {row.status}; {why}",
    )

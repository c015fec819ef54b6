"""What the dashboard's data routes answer: a page of result summaries (the results
table, filtered server-side) and the text of a rollout's tokens (the token view)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rollserve.contract.result import FailureKind, TerminalStatus

# The results table's failure filter: a FailureKind, or none (results that did not fail).
FailureFilter = Literal["infra", "agent", "timeout", "none"]


class ResultSummary(BaseModel):
    """One finished rollout, as a row of the results table."""

    seq: int = Field(description="its position in the results cursor")
    id: str = Field(description="the rollout's id")
    group_id: str = Field(description="its group")
    data_source: str = Field(description="the handler that ran it")
    status: TerminalStatus = Field(description="how it ended")
    reward: float | None = Field(description="its reward; null when nothing was scored")
    masked: bool = Field(description="do not train on it")
    failure_kind: FailureKind | None = Field(description="infra | agent | timeout; null when it did not fail")
    policy_version: int | None = Field(
        description="the newest policy version among its turns; null when none was stamped"
    )
    duration: float | None = Field(description="seconds, the whole rollout (timing.total)")
    finished_at: float | None = Field(description="Unix time its result was stored")


class ResultSummaryPage(BaseModel):
    """``GET /v1/results/summaries``: newest first."""

    summaries: list[ResultSummary] = Field(description="newest first (descending seq)")
    total: int = Field(
        description="finished results that match the filters, in all, "
        "counted up to a cap (10,000): when total_capped, at "
        "least this many match"
    )
    total_capped: bool = Field(description="more results match than total: the count stopped at its cap")
    next_before: int | None = Field(
        description="pass it as ``before`` for the next (older) page; null on the last page"
    )


class TokenTexts(BaseModel):
    """``GET /v1/rollouts/{id}/tokens``: the text of each distinct token id of the
    rollout's sequences, each id decoded alone (a piece of a multi-byte character
    shows as U+FFFD)."""

    tokenizer: str = Field(description="the tokenizer that decoded them")
    ids: list[int] = Field(description="the distinct token ids, ascending")
    texts: list[str] = Field(description="the text of each id, in the order of ids")

"""What a trainer submits: a batch of tasks, each run ``n`` times as one group."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollserve.agent.loop import AgentLimits
from rollserve.engine.rollout import Timeouts
from rollserve.llm.base import SamplingParams


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:/@+=-]+$",
        description="client-chosen id: resubmitting the same id returns the same group "
        "(idempotent retries); a different task under a known id is a 409",
    )
    data_source: str = Field(..., min_length=1, max_length=100)
    instance: dict[str, Any]
    n: int = Field(1, ge=1, le=1024, description="samples of this task (one group)")
    sampling: SamplingParams | None = None
    agent: AgentLimits | None = None
    timeouts: Timeouts | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskRequest] = Field(..., min_length=1, max_length=10_000)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    agent: AgentLimits = Field(default_factory=AgentLimits)
    timeouts: Timeouts = Field(default_factory=Timeouts)


def merged(batch: BaseModel, task: BaseModel | None) -> BaseModel:
    """Batch-level settings with the task's explicitly set fields on top."""
    if task is None:
        return batch
    return batch.model_copy(update=task.model_dump(exclude_unset=True))


def request_hash(task: TaskRequest, batch: SubmitRequest) -> str:
    """Fingerprint of what a task asks for, to tell a retry from a conflicting reuse."""
    body = {
        "task": task.model_dump(mode="json", exclude={"id"}),
        "sampling": merged(batch.sampling, task.sampling).model_dump(mode="json"),
        "agent": merged(batch.agent, task.agent).model_dump(mode="json"),
        "timeouts": merged(batch.timeouts, task.timeouts).model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

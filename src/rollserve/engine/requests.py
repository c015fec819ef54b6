"""What a trainer submits: a batch of tasks, each run ``n`` times as one group."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rollserve.agent.loop import AgentLimits
from rollserve.engine.rollout import Timeouts
from rollserve.llm.base import SamplingParams
from rollserve.validation import JSONInputError, check_json

MIB = 1 << 20


class RequestLimits(BaseModel):
    """How much one request may carry (the defaults are what ``rollserve serve`` uses)."""

    max_request_bytes: int = Field(
        64 * MIB, ge=1024, description="a request body larger than this is refused (413)")
    max_instance_bytes: int = Field(
        4 * MIB, ge=1024, description="a task's instance (or metadata) larger than this, as "
        "compact JSON, is refused (422): rendering and tokenizing its prompt would cost "
        "seconds of CPU per MB, and 4 MiB is about the text of a 1M-token context")


def _storable(value: dict[str, Any]) -> dict[str, Any]:
    """Refuse JSON the store, the hash and the chat template cannot hold (see
    ``rollserve.validation``); over HTTP the body was checked already, this covers
    every other way a request is built."""
    try:
        check_json(value)
    except JSONInputError as exc:
        raise ValueError(str(exc)) from None
    return value


JSONObject = Annotated[dict[str, Any], AfterValidator(_storable)]


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
    instance: JSONObject
    n: int = Field(1, ge=1, le=1024, description="samples of this task (one group)")
    sampling: SamplingParams | None = None
    agent: AgentLimits | None = None
    timeouts: Timeouts | None = None
    metadata: JSONObject = Field(default_factory=dict)


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


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (what the size limits count)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def request_hash(task: TaskRequest, batch: SubmitRequest) -> str:
    """Fingerprint of what a task asks for, to tell a retry from a conflicting reuse."""
    body = {
        "task": task.model_dump(mode="json", exclude={"id"}),
        "sampling": merged(batch.sampling, task.sampling).model_dump(mode="json"),
        "agent": merged(batch.agent, task.agent).model_dump(mode="json"),
        "timeouts": merged(batch.timeouts, task.timeouts).model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

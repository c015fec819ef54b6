"""What the engine needs of a request beyond its models (``rollserve.contract``): the
size limits, batch settings merged under a task's, sizes and fingerprints."""

from __future__ import annotations

import hashlib
import json
from typing import TypeVar

from pydantic import BaseModel, Field, JsonValue

from rollserve.contract import SubmitRequest, TaskRequest
from rollserve.contract.judge import RescoreRequest

MIB = 1 << 20

M = TypeVar("M", bound=BaseModel)


class RequestLimits(BaseModel):
    """How much one request may carry (the defaults are what ``rollserve serve`` uses)."""

    max_request_bytes: int = Field(
        64 * MIB, ge=1024, description="a request body larger than this is refused as too large"
    )
    max_instance_bytes: int = Field(
        4 * MIB,
        ge=1024,
        description="a task's instance (or metadata) larger than this, as "
        "compact JSON, is refused naming it: rendering and tokenizing its prompt would cost "
        "seconds of CPU per MB, and 4 MiB is about the text of a 1M-token context",
    )


def merged(batch: M, task: M | None) -> M:
    """Batch-level settings with the task's explicitly set fields on top."""
    if task is None:
        return batch
    return batch.model_copy(update=task.model_dump(exclude_unset=True))


def json_size(value: JsonValue) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (what the size limits count)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


_LATER_FIELDS = ("oversample", "filter_zero_variance", "judge")


def request_hash(task: TaskRequest, batch: SubmitRequest) -> str:
    """Fingerprint of what a task asks for, to tell a retry from a conflicting reuse."""
    # A new field at its default is left out, so a task's fingerprint stays what it was
    # before the field existed (an idempotent retry across an upgrade is no conflict).
    exclude = {"id"} | {name for name in _LATER_FIELDS if getattr(task, name) == TaskRequest.model_fields[name].default}
    body = {
        "task": task.model_dump(mode="json", exclude=exclude),
        "sampling": merged(batch.sampling, task.sampling).model_dump(mode="json"),
        "agent": merged(batch.agent, task.agent).model_dump(mode="json"),
        "timeouts": merged(batch.timeouts, task.timeouts).model_dump(mode="json"),
    }
    judge = task.judge or batch.judge
    if judge is not None:  # left out when unset: fingerprints from before judges stay
        body["judge"] = judge.model_dump(mode="json")
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def rescore_hash(request: RescoreRequest) -> str:
    """Fingerprint of what a re-scoring asks for (its key left out), to tell a retry
    under its ``idempotency_key`` from another request reusing the key."""
    body = request.model_dump(mode="json", exclude={"idempotency_key"})
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

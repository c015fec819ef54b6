"""What the store's rows read back as: a group, a rollout with its spec and its result,
and the result's stored form (compact JSON without ``seq``: the column is the truth)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from rollserve.contract import ROLLOUT_STATUSES, RolloutResult, RolloutStatus
from rollserve.engine.rollout import RolloutSpec


@dataclass
class GroupRow:
    id: str
    task_id: str
    client_key: str | None
    request_hash: str
    n: int
    created_at: float


@dataclass
class RolloutRow:
    id: str
    group_id: str
    spec: RolloutSpec
    status: RolloutStatus
    attempt: int
    result: RolloutResult | None  # with its seq
    seq: int | None
    created_at: float
    finished_at: float | None


COLUMNS = "id, group_id, spec, status, attempt, result, seq, created_at, finished_at"


def rollout_row(row: tuple[Any, ...]) -> RolloutRow:
    rid, gid, spec, status, attempt, result, seq, created, finished = row
    return RolloutRow(
        id=rid,
        group_id=gid,
        spec=RolloutSpec.model_validate_json(spec),
        status=stored_status(status),
        attempt=int(attempt),
        result=decode_result(result, int(seq)) if result else None,
        seq=seq,
        created_at=created,
        finished_at=finished,
    )


def stored_status(stored: str) -> RolloutStatus:
    for status in ROLLOUT_STATUSES:
        if stored == status:
            return status
    raise ValueError(f"unknown rollout status {stored!r} in the store")


def encode_result(result: RolloutResult) -> str:
    """The result as stored: compact JSON, without ``seq``."""
    try:
        return result.model_dump_json(exclude={"seq"})
    except PydanticSerializationError:  # a lone surrogate somewhere: escaped by json
        return json.dumps(result.model_dump(mode="json", exclude={"seq"}), separators=(",", ":"))


def decode_result(text: str, seq: int) -> RolloutResult:
    """A stored result, validated, with its cursor position."""
    try:
        result = RolloutResult.model_validate_json(text)
    except ValidationError:  # pydantic's parser refuses an escaped lone surrogate; json does not
        result = RolloutResult.model_validate(json.loads(text))
    result.seq = seq
    return result

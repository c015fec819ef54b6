"""The HTTP calls of the rollserve API, described once for both clients.

Each function returns a ``Call``: method, path, query, body, and the contract model
the answer is validated into. The sync and async clients only differ in how they
send it. Request bodies may be contract models (``rollserve.contract``) or plain
dicts of the same shape (sent as they are: the server checks them and names the field
at fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, JsonValue

from rollserve.contract import (
    MAX_WAIT,
    AgentLimits,
    BackendAdded,
    BackendList,
    BackendRemoved,
    CancelResponse,
    GroupCancelResponse,
    GroupView,
    Health,
    Paused,
    ResultsPage,
    Resumed,
    RolloutView,
    RunResponse,
    SamplingParams,
    ServiceStatus,
    SubmitResponse,
    TaskRequest,
    Timeouts,
    WeightsLoaded,
)
from rollserve.contract.judge import JudgeRequest, RescoreResponse

T = TypeVar("T", bound=BaseModel)
JSONBody = dict[str, JsonValue]


@dataclass
class Call(Generic[T]):
    method: str
    path: str
    response: type[T]  # what the answer is validated into
    params: dict[str, str | int | float] = field(default_factory=dict)
    json: JSONBody | None = None
    read_timeout: float = 30.0  # raised for long-polls


class RollserveError(Exception):
    """The server refused a call; ``status`` is the HTTP code, ``detail`` its reason,
    ``fields`` the request fields it names (empty when it names none)."""

    def __init__(self, status: int, detail: JsonValue, fields: tuple[str, ...] = ()):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.fields = fields


def _json(value: BaseModel | JSONBody) -> JSONBody:
    """A body part as JSON: a model's fields as set (so a task's unset sampling fields
    leave the batch's in force, as the server merges them), or the dict itself."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return value


def _settings(
    sampling: SamplingParams | JSONBody | None,
    agent: AgentLimits | JSONBody | None,
    timeouts: Timeouts | JSONBody | None,
) -> JSONBody:
    """The batch-wide settings given (an empty one is left out)."""
    body: JSONBody = {}
    for key, value in (("sampling", sampling), ("agent", agent), ("timeouts", timeouts)):
        if value is not None and (part := _json(value)):
            body[key] = part
    return body


def submit(
    tasks: Sequence[TaskRequest | JSONBody],
    sampling: SamplingParams | JSONBody | None = None,
    agent: AgentLimits | JSONBody | None = None,
    timeouts: Timeouts | JSONBody | None = None,
) -> Call[SubmitResponse]:
    """Submit a batch of tasks (each with ``n`` samples: one group)."""
    body: JSONBody = {"tasks": [_json(task) for task in tasks], **_settings(sampling, agent, timeouts)}
    return Call("POST", "/v1/rollouts", SubmitResponse, json=body)


def run(
    task: TaskRequest | JSONBody,
    sampling: SamplingParams | JSONBody | None = None,
    agent: AgentLimits | JSONBody | None = None,
    timeouts: Timeouts | JSONBody | None = None,
    wait: float = 600.0,
) -> Call[RunResponse]:
    """Submit one task and wait (up to ``wait`` seconds) for its results."""
    body: JSONBody = {"task": _json(task), **_settings(sampling, agent, timeouts), "wait": wait}
    return Call("POST", "/v1/rollouts:run", RunResponse, json=body, read_timeout=wait + 30)


def rollout(rollout_id: str, wait: float = 0.0) -> Call[RolloutView]:
    """A rollout's state and, once done, its result (``wait``: long-poll seconds)."""
    return Call("GET", f"/v1/rollouts/{rollout_id}", RolloutView, params={"wait": wait}, read_timeout=wait + 30)


def group(group_id: str, wait: float = 0.0, results: bool = True) -> Call[GroupView]:
    """A task's ``n`` samples together (``wait``: long-poll seconds)."""
    return Call(
        "GET",
        f"/v1/groups/{group_id}",
        GroupView,
        params={"wait": wait, "results": str(results).lower()},
        read_timeout=wait + 30,
    )


def results(after: int = 0, limit: int = 100, wait: float = 0.0, rescored: bool | None = None) -> Call[ResultsPage]:
    """Results after cursor position ``after``, in completion order; ``rescored``:
    None every result, False none re-scored (``rescored_from`` set), True only those."""
    params: dict[str, Any] = {"after": after, "limit": limit, "wait": wait}
    if rescored is not None:
        params["rescored"] = str(rescored).lower()
    return Call("GET", "/v1/results", ResultsPage, params=params, read_timeout=wait + 30)


def rescore(
    result_ids: Sequence[str], judge: JudgeRequest | JSONBody | None = None, idempotency_key: str | None = None
) -> Call[RescoreResponse]:
    """Score stored results again, nothing sampled (``judge``: a new rubric; None: the
    family's own grader). With ``idempotency_key`` a retry (after a timeout, a dropped
    connection) gets the first request's answer instead of re-scoring again; a 409
    saying it still runs is retried by the client."""
    body: JSONBody = {"result_ids": list(result_ids)}
    if judge is not None:
        body["judge"] = _json(judge)
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    return Call("POST", "/v1/results/rescore", RescoreResponse, json=body, read_timeout=MAX_WAIT + 30)


def cancel(rollout_id: str) -> Call[CancelResponse]:
    """Cancel a rollout in flight."""
    return Call("DELETE", f"/v1/rollouts/{rollout_id}", CancelResponse, read_timeout=60)


def cancel_group(group_id: str) -> Call[GroupCancelResponse]:
    """Cancel every rollout of a group still in flight."""
    return Call("DELETE", f"/v1/groups/{group_id}", GroupCancelResponse, read_timeout=60)


def status() -> Call[ServiceStatus]:
    """The server's status: stages, counts, backends, sandboxes."""
    return Call("GET", "/v1/status", ServiceStatus)


def health() -> Call[Health]:
    return Call("GET", "/healthz", Health)


def add_backend(spec: JSONBody) -> Call[BackendAdded]:
    """Register an inference server by URL: ``{"url", "kind"?, "name"?, ...}``."""
    return Call("POST", "/v1/llm/backends", BackendAdded, json=spec)


def list_backends() -> Call[BackendList]:
    return Call("GET", "/v1/llm/backends", BackendList)


def remove_backend(name: str) -> Call[BackendRemoved]:
    return Call("DELETE", f"/v1/llm/backends/{name}", BackendRemoved)


def pause(mode: str = "finish", timeout: float | None = None, forward: bool | None = None) -> Call[Paused]:
    """Hold new LLM calls: ``finish`` waits (up to ``timeout`` s) for those in flight,
    ``abort`` aborts them (sent again after the resume)."""
    body: JSONBody = {"mode": mode}
    if timeout is not None:
        body["timeout"] = timeout
    if forward is not None:
        body["forward"] = forward
    return Call(
        "POST", "/v1/llm/pause", Paused, json=body, read_timeout=(timeout if timeout is not None else MAX_WAIT) + 30
    )


def resume(policy_version: int | None = None, allow_lower_version: bool = False) -> Call[Resumed]:
    """Let LLM calls go again, stamped with ``policy_version`` from now on. A version
    below the one in force is refused (409, generation stays paused) unless
    ``allow_lower_version`` (a trainer restarting from an older checkpoint)."""
    body: JSONBody = {} if policy_version is None else {"policy_version": policy_version}
    if allow_lower_version:
        body["allow_lower_version"] = True
    return Call("POST", "/v1/llm/resume", Resumed, json=body, read_timeout=60)


def load_weights(weights: JSONBody, policy_version: int | None = None, timeout: float = 600.0) -> Call[WeightsLoaded]:
    """Load ``{"kind": "lora", "name", "path"}`` or ``{"kind": "full", "path"}`` into every
    token-level backend (only while paused with nothing in flight)."""
    body: JSONBody = {"weights": weights, "timeout": timeout}
    if policy_version is not None:
        body["policy_version"] = policy_version
    return Call("POST", "/v1/llm/weights", WeightsLoaded, json=body, read_timeout=timeout + 30)

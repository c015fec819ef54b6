"""The HTTP calls of the rollserve API, described once for both clients.

Each function returns a ``Call`` (method, path, query, body); the sync and async
clients only differ in how they send it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    read_timeout: float = 30.0  # raised for long-polls


class RollserveError(Exception):
    """The server refused a call; ``status`` is the HTTP code, ``detail`` its reason."""

    def __init__(self, status: int, detail: Any):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _batch(tasks: list[dict], sampling: dict | None, agent: dict | None,
           timeouts: dict | None) -> dict:
    body: dict[str, Any] = {"tasks": tasks}
    for key, value in (("sampling", sampling), ("agent", agent), ("timeouts", timeouts)):
        if value:
            body[key] = value
    return body


def submit(tasks: list[dict], sampling: dict | None = None, agent: dict | None = None,
           timeouts: dict | None = None) -> Call:
    return Call("POST", "/v1/rollouts", json=_batch(tasks, sampling, agent, timeouts))


def run(task: dict, sampling: dict | None = None, agent: dict | None = None,
        timeouts: dict | None = None, wait: float = 600.0) -> Call:
    body = _batch([task], sampling, agent, timeouts)
    body["task"] = body.pop("tasks")[0]
    body["wait"] = wait
    return Call("POST", "/v1/rollouts:run", json=body, read_timeout=wait + 30)


def rollout(rollout_id: str, wait: float = 0.0) -> Call:
    return Call("GET", f"/v1/rollouts/{rollout_id}", params={"wait": wait},
                read_timeout=wait + 30)


def group(group_id: str, wait: float = 0.0, results: bool = True) -> Call:
    return Call("GET", f"/v1/groups/{group_id}",
                params={"wait": wait, "results": str(results).lower()}, read_timeout=wait + 30)


def results(after: int = 0, limit: int = 100, wait: float = 0.0) -> Call:
    return Call("GET", "/v1/results", params={"after": after, "limit": limit, "wait": wait},
                read_timeout=wait + 30)


def cancel(rollout_id: str) -> Call:
    return Call("DELETE", f"/v1/rollouts/{rollout_id}", read_timeout=60)


def cancel_group(group_id: str) -> Call:
    return Call("DELETE", f"/v1/groups/{group_id}", read_timeout=60)


def status() -> Call:
    return Call("GET", "/v1/status")


def health() -> Call:
    return Call("GET", "/healthz")


def add_backend(spec: dict) -> Call:
    return Call("POST", "/v1/llm/backends", json=spec)


def list_backends() -> Call:
    return Call("GET", "/v1/llm/backends")


def remove_backend(name: str) -> Call:
    return Call("DELETE", f"/v1/llm/backends/{name}")

"""Routes for rollouts, groups, results, events and status."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from rollserve.api.errors import errors, json_response
from rollserve.api.guards import StrictJSONRoute
from rollserve.engine.requests import SubmitRequest, TaskRequest
from rollserve.engine.rollout import TERMINAL
from rollserve.engine.submit import submit
from rollserve.agent.loop import AgentLimits
from rollserve.engine.rollout import Timeouts
from rollserve.llm.base import SamplingParams
from rollserve.server import Service
from rollserve.validation import INT64_MAX

router = APIRouter(prefix="/v1", tags=["rollouts"], route_class=StrictJSONRoute)

MAX_WAIT = 600.0
WaitParam = Query(0.0, ge=0.0, le=MAX_WAIT, description="long-poll: seconds to wait for completion")


def _service(request: Request) -> Service:
    return request.app.state.service


async def _rollout_view(service: Service, rollout_id: str) -> dict | None:
    live = service.engine.live.get(rollout_id)
    if live is not None:
        return {"id": live.id, "group_id": live.spec.group_id, "status": live.status,
                "done": False, "seq": None, "result": None}
    row = await service.store.rollout(rollout_id)
    if row is None:
        return None
    return {"id": row.id, "group_id": row.group_id, "status": row.status,
            "done": row.status in TERMINAL, "seq": row.seq, "result": row.result}


async def _group_view(service: Service, group_id: str, include_results: bool) -> dict | None:
    found = await service.store.group(group_id)
    if found is None:
        return None
    group, rows = found
    rollouts = []
    counts: dict[str, int] = {}
    for row in rows:
        live = service.engine.live.get(row.id)
        status = live.status if live is not None else row.status
        counts[status] = counts.get(status, 0) + 1
        # Done once its result is stored: a rollout still in flight may already carry
        # its final status while cleanup runs and the result is written.
        item = {"id": row.id, "status": status, "done": live is None and status in TERMINAL,
                "seq": row.seq}
        if include_results:
            item["result"] = row.result if live is None else None
        rollouts.append(item)
    return {
        "group_id": group.id,
        "task_id": group.task_id,
        "n": group.n,
        "done": all(r["done"] for r in rollouts),
        "status_counts": counts,
        "rollouts": rollouts,
    }


SUBMIT_ERRORS = errors(400, 409, 429)


@router.post("/rollouts", status_code=202, responses=SUBMIT_ERRORS)
async def submit_rollouts(body: SubmitRequest, request: Request) -> dict:
    """Submit a batch of tasks; each task with ``n`` samples becomes one group."""
    accepted = await submit(_service(request).engine, body, request.app.state.limits)
    return {"groups": [a.to_dict() for a in accepted]}


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: TaskRequest
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    agent: AgentLimits = Field(default_factory=AgentLimits)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    wait: float = Field(MAX_WAIT, gt=0, le=MAX_WAIT)


@router.post("/rollouts:run", responses=SUBMIT_ERRORS)
async def run_rollouts(body: RunRequest, request: Request) -> Response:
    """Submit one task and wait for its results (for scripts)."""
    service = _service(request)
    batch = SubmitRequest(tasks=[body.task], sampling=body.sampling, agent=body.agent,
                          timeouts=body.timeouts)
    (accepted,) = await submit(service.engine, batch, request.app.state.limits)
    await service.engine.wait_finished(accepted.rollout_ids, body.wait)
    view = await _group_view(service, accepted.group_id, include_results=True)
    return await json_response(
        {**(view or {}), "results": [r.get("result") for r in (view or {}).get("rollouts", [])]})


@router.get("/rollouts/{rollout_id}", responses=errors(404))
async def get_rollout(rollout_id: str, request: Request, wait: float = WaitParam) -> Response:
    service = _service(request)
    if wait > 0:
        await service.engine.wait_finished([rollout_id], wait)
    view = await _rollout_view(service, rollout_id)
    if view is None:
        raise HTTPException(404, f"no rollout {rollout_id!r} (unknown, or past retention)")
    return await json_response(view)


@router.delete("/rollouts/{rollout_id}", responses=errors(404))
async def cancel_rollout(rollout_id: str, request: Request) -> dict:
    service = _service(request)
    cancelled = service.engine.cancel(rollout_id)
    if cancelled:
        await service.engine.wait_finished([rollout_id], 30.0)
    view = await _rollout_view(service, rollout_id)
    if view is None:
        raise HTTPException(404, f"no rollout {rollout_id!r}")
    return {"id": rollout_id, "cancelled": cancelled, "status": view["status"]}


@router.get("/groups/{group_id}", responses=errors(404))
async def get_group(
    group_id: str, request: Request, wait: float = WaitParam, results: bool = True
) -> Response:
    service = _service(request)
    view = await _group_view(service, group_id, include_results=False)
    if view is None:
        raise HTTPException(404, f"no group {group_id!r} (unknown, or past retention)")
    if wait > 0 and not view["done"]:
        await service.engine.wait_finished([r["id"] for r in view["rollouts"]], wait)
    return await json_response(await _group_view(service, group_id, include_results=results))


@router.delete("/groups/{group_id}", responses=errors(404))
async def cancel_group(group_id: str, request: Request) -> dict:
    service = _service(request)
    view = await _group_view(service, group_id, include_results=False)
    if view is None:
        raise HTTPException(404, f"no group {group_id!r}")
    ids = [r["id"] for r in view["rollouts"]]
    cancelled = [i for i in ids if service.engine.cancel(i)]
    await service.engine.wait_finished(cancelled, 30.0)
    return {"group_id": group_id, "cancelled": cancelled}


@router.get("/results")
async def get_results(
    request: Request,
    after: int = Query(0, ge=0, le=INT64_MAX, description="cursor: the last seq you have"),
    limit: int = Query(100, ge=1, le=10_000),
    wait: float = WaitParam,
) -> Response:
    """Finished results in completion order; pass the returned ``next`` as ``after``."""
    service = _service(request)
    deadline = time.monotonic() + wait
    while True:
        rows = await service.store.results_after(after, limit)
        remaining = deadline - time.monotonic()
        if rows or remaining <= 0:
            break
        await service.engine.events.wait_change(remaining)
    results = [{"seq": seq, **result} for seq, result in rows]
    return await json_response({"results": results, "next": rows[-1][0] if rows else after})


@router.get("/events", response_class=EventSourceResponse, responses={
    200: {"description": "a stream of `state` events (JSON data)",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
async def events(
    request: Request,
    duration: float | None = Query(None, gt=0, le=86_400,
                                   description="end the stream after this many seconds "
                                               "(default: never)"),
) -> EventSourceResponse:
    """Server-sent events: one ``state`` event per rollout state change."""
    bus = _service(request).engine.events
    queue = bus.subscribe()
    loop = asyncio.get_running_loop()
    ends = None if duration is None else loop.time() + duration

    async def stream():
        try:
            while True:
                left = None if ends is None else ends - loop.time()
                if left is not None and left <= 0:
                    return
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    return
                yield {"event": "state", "data": json.dumps(event)}
        finally:
            bus.unsubscribe(queue)

    return EventSourceResponse(stream(), ping=15)


@router.get("/status", tags=["service"])
async def status(request: Request) -> dict:
    service = _service(request)
    return {
        **service.engine.status(),
        "backends": service.router.list(),
        "llm": service.router.status(),
        "handlers": service.handlers.names(),
        "recovered_at_start": service.recovered,
        "sandboxes": service.sandbox_status(),
    }


"""Routes for rollouts, groups, results, events and status.

Each route calls one operation of the engine's facade (``engine.facade.Rollouts``) and
answers its contract model (``rollserve.contract``, declared as the route's
``response_model``); what the engine refuses comes back as a typed error that
``api.errors`` turns into a status code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from rollserve.api.base import ApiService, service_of
from rollserve.api.errors import FieldHTTPError, errors, model_response
from rollserve.api.guards import StrictJSONRoute
from rollserve.contract import (
    MAX_WAIT,
    BackendState,
    CancelResponse,
    GroupCancelResponse,
    GroupView,
    NodesChanged,
    ResultsPage,
    RolloutView,
    RouterStatus,
    RunRequest,
    RunResponse,
    ServiceStatus,
    SubmitRequest,
    SubmitResponse,
)
from rollserve.contract.judge import RescoreRequest, RescoreResponse
from rollserve.contract.validation import INT64_MAX
from rollserve.contract.views import JudgeState
from rollserve.engine.facade import Rollouts

router = APIRouter(prefix="/v1", tags=["rollouts"], route_class=StrictJSONRoute)

EVENTS_SEND_TIMEOUT = 30.0  # seconds one event may wait on a client that reads nothing

WaitParam = Query(0.0, ge=0.0, le=MAX_WAIT, description="long-poll: seconds to wait for completion")


def _rollouts(request: Request) -> Rollouts:
    return service_of(request).rollouts


SUBMIT_ERRORS = errors(400, 409, 429)


@router.post("/rollouts", status_code=202, response_model=SubmitResponse, responses=SUBMIT_ERRORS)
async def submit_rollouts(body: SubmitRequest, request: Request) -> SubmitResponse:
    """Submit a batch of tasks; each task with ``n`` samples becomes one group."""
    return SubmitResponse(groups=await _rollouts(request).submit(body))


@router.post("/rollouts:run", response_model=RunResponse, responses=SUBMIT_ERRORS)
async def run_rollouts(body: RunRequest, request: Request) -> Response:
    """Submit one task and wait for its results (for scripts)."""
    return await model_response(await _rollouts(request).run(body))


@router.get("/rollouts/{rollout_id}", response_model=RolloutView, responses=errors(404))
async def get_rollout(rollout_id: str, request: Request, wait: float = WaitParam) -> Response:
    """A rollout's state, and its result once done."""
    return await model_response(await _rollouts(request).rollout(rollout_id, wait))


@router.delete("/rollouts/{rollout_id}", response_model=CancelResponse, responses=errors(404))
async def cancel_rollout(rollout_id: str, request: Request) -> CancelResponse:
    """Cancel a rollout: the LLM call or scoring in flight stops, its cleanup runs."""
    return await _rollouts(request).cancel(rollout_id)


@router.get("/groups/{group_id}", response_model=GroupView, responses=errors(404))
async def get_group(group_id: str, request: Request, wait: float = WaitParam, results: bool = True) -> Response:
    """A task's ``n`` samples together (``results=false``: their states only)."""
    return await model_response(await _rollouts(request).group(group_id, wait, results))


@router.delete("/groups/{group_id}", response_model=GroupCancelResponse, responses=errors(404))
async def cancel_group(group_id: str, request: Request) -> GroupCancelResponse:
    """Cancel every rollout of a group still in flight."""
    return await _rollouts(request).cancel_group(group_id)


@router.get("/results", response_model=ResultsPage)
async def get_results(
    request: Request,
    after: int = Query(0, ge=0, le=INT64_MAX, description="cursor: the last seq you have"),
    limit: int = Query(100, ge=1, le=10_000),
    wait: float = WaitParam,
    rescored: Literal["any", "true", "false"] = Query(
        "any",
        description="any: every result; false: leave out re-scored results (those "
        "with rescored_from: the same tokens scored again); true: only them",
    ),
) -> Response:
    """Finished results in completion order; pass the returned ``next`` as ``after``."""
    return await model_response(await _rollouts(request).results(after, limit, wait, rescored))


@router.post("/results/rescore", response_model=RescoreResponse, responses=errors(404, 409, 422))
async def rescore_results(
    body: RescoreRequest,
    request: Request,
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        description="the body's idempotency_key, as a header (the same key in both, or one of them)",
    ),
) -> Response:
    """EVAL again on stored results with another evaluator (a new rubric, the family's
    grader as the server has it now), without sampling: new results beside the old
    ones (new ids, in the results cursor; ``rescored_from`` and ``scoring`` say so).
    Under an ``idempotency_key`` (the body's or the header's) it runs once."""
    if idempotency_key is not None:
        if body.idempotency_key not in (None, idempotency_key):
            raise FieldHTTPError(
                422, "idempotency_key", "differs from the Idempotency-Key header: give one key, in either place"
            )
        try:
            body = RescoreRequest.model_validate(
                {**body.model_dump(exclude_unset=True), "idempotency_key": idempotency_key}
            )
        except ValidationError as exc:
            raise FieldHTTPError.invalid(exc) from None
    return await model_response(await _rollouts(request).rescore(body))


@router.get(
    "/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "a stream of `state` events, each a StateEvent as JSON",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def events(
    request: Request,
    duration: float | None = Query(
        None, gt=0, le=86_400, description="end the stream after this many seconds (default: never)"
    ),
) -> EventSourceResponse:
    """Server-sent events: one ``state`` event per rollout state change."""
    rollouts = _rollouts(request)
    loop = asyncio.get_running_loop()
    ends = None if duration is None else loop.time() + duration

    async def stream() -> AsyncIterator[dict[str, str]]:
        async with rollouts.events() as queue:
            while True:
                left = None if ends is None else ends - loop.time()
                if left is not None and left <= 0:
                    return
                event = await rollouts.next_event(queue, left)  # None: the end, or a shutdown
                if event is None:
                    return
                yield {"event": "state", "data": event.model_dump_json(exclude_unset=True)}

    # A client that stops reading (its socket buffers full) would hold the generator, its
    # task and its subscription forever: a send that waits longer than this ends the stream.
    return EventSourceResponse(stream(), ping=15, send_timeout=EVENTS_SEND_TIMEOUT)


@router.get("/status", tags=["service"], response_model=ServiceStatus)
async def status(request: Request) -> ServiceStatus:
    """Queues and busy workers per stage, counts, throughput, backends, sandboxes."""
    return service_status(service_of(request))


def service_status(service: ApiService) -> ServiceStatus:
    """What ``GET /v1/status`` answers (the dashboard's stream sends it too)."""
    return ServiceStatus(
        **dict(service.rollouts.status()),
        backends=[BackendState.model_validate(b) for b in service.router.list()],
        llm=RouterStatus.model_validate(service.router.status()),
        sandboxes=service.sandbox_status(),
        judges=[JudgeState.model_validate(j) for j in service.judges.describe()],
    )


@router.post("/nodes/{name}/drain", response_model=NodesChanged, responses=errors(404))
async def drain_node(name: str, request: Request) -> NodesChanged:
    """A Ray node (``serve --ray``) takes no new rollouts; those it hosts finish."""
    return NodesChanged(nodes=await _rollouts(request).drain_node(name, True))


@router.post("/nodes/{name}/undrain", response_model=NodesChanged, responses=errors(404))
async def undrain_node(name: str, request: Request) -> NodesChanged:
    """The node takes new rollouts again."""
    return NodesChanged(nodes=await _rollouts(request).drain_node(name, False))

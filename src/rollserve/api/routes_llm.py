"""Inference backends at runtime: add, list, drain, remove; pause and resume generation.

A weight update from the trainer's side:

    POST /v1/llm/pause   {"mode": "finish"}     # returns once calls in flight are done
    POST /v1/llm/weights {"weights": {"kind": "lora", "name": "policy", "path": DIR}}
                                                # (or load them into the servers yourself)
    POST /v1/llm/resume  {"policy_version": 2}  # turns sampled from now on say 2
                                                # (lower than in force: 409, unless
                                                # "allow_lower_version": true)
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Query, Request

from rollserve.api.backend_add import add_verified
from rollserve.api.base import service_of
from rollserve.api.errors import FieldHTTPError, errors
from rollserve.api.guards import StrictJSONRoute
from rollserve.contract import (
    BackendAdded,
    BackendDrained,
    BackendInfo,
    BackendList,
    BackendRemoved,
    BackendState,
    BackendUndrained,
    Paused,
    PauseRequest,
    Resumed,
    ResumeRequest,
    RouterStatus,
    WeightsLoaded,
    WeightsRequest,
)
from rollserve.llm.backends import RemoteBackendSpec, backend_from_spec
from rollserve.llm.base import LoadsWeights
from rollserve.llm.routing import LowerPolicyVersion, Router, WeightsRefused, WeightUpdate

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/llm", tags=["llm"], route_class=StrictJSONRoute)


def _router(request: Request) -> Router:
    return service_of(request).router


async def _keep_weights(request: Request, done: str) -> None:
    """Record the weights in force for a restart (``ApiService.save_weights``); 503 saying
    what was ``done`` if they could not be written."""
    service = service_of(request)
    try:
        await service.save_weights()
    except OSError as exc:
        log.error("%s, but the weights in force were not recorded: %s", done, exc)
        raise HTTPException(
            503,
            f"{done}, but the weights in force could not be recorded "
            f"in {service.weights_path} ({exc}): a restart would not "
            "know them; fix the state dir and call this again",
        ) from exc


def _state(llm_router: Router, name: str) -> BackendState:
    """``name``'s state as the router sees it (404 if no backend has that name)."""
    for backend in llm_router.list():
        if backend["name"] == name:
            return BackendState.model_validate(backend)
    raise HTTPException(404, f"no backend named {name!r}")


@router.get("/backends", response_model=BackendList)
async def list_backends(request: Request) -> BackendList:
    """Every backend with its health, load (outstanding, sessions) and draining state."""
    llm_router = _router(request)
    return BackendList(
        backends=[BackendState.model_validate(b) for b in llm_router.list()],
        router=RouterStatus.model_validate(llm_router.status()),
    )


@router.get("/status", response_model=RouterStatus)
async def status(request: Request) -> RouterStatus:
    """The router: paused or not, the policy version of new turns, call counts."""
    return RouterStatus.model_validate(_router(request).status())


@router.post("/backends", status_code=201, response_model=BackendAdded, responses=errors(409))
async def add_backend(spec: RemoteBackendSpec, request: Request) -> BackendAdded:
    """Add an inference server by URL; rollouts waiting for one start at once.

    While the policy is a LoRA adapter (``POST /v1/llm/weights``), the new server's
    requests name it: serve it there too (vLLM's ``--lora-modules NAME=PATH``). 409 for a
    server that cannot serve an adapter, one whose ``/v1/models`` does not list it (or
    does not answer), or while a weight load is under way. The listing proves the name
    only: an adapter of that name loaded from an older checkpoint passes.

    Embedded (in-process) backends are started from the command line only: they load
    a model file from the server's disk."""
    llm_router = _router(request)
    try:
        backend = backend_from_spec(spec.spec())
    except ValueError as exc:  # the URL, as the HTTP client reads it
        raise FieldHTTPError(422, "url", str(exc)) from exc
    if any(b["name"] == backend.name for b in llm_router.list()):
        await backend.close()
        raise HTTPException(409, f"a backend named {backend.name!r} exists; remove it first")
    try:  # after a LoRA load, it names the adapter; refused if it does not serve it
        await add_verified(llm_router, backend, spec.spec().model_dump_json())
    except WeightsRefused as exc:
        await backend.close()
        raise HTTPException(409, str(exc)) from exc
    return BackendAdded(backend=BackendInfo.model_validate(backend.describe()))


@router.delete("/backends/{name}", response_model=BackendRemoved, responses=errors(404))
async def remove_backend(
    name: str,
    request: Request,
    grace: float = Query(0.0, ge=0, le=3600, description="seconds for calls in flight to finish"),
) -> BackendRemoved:
    """Remove a backend; its trajectories move to another at their next call."""
    llm_router = _router(request)
    _state(llm_router, name)
    await llm_router.remove(name, grace=grace)
    return BackendRemoved(removed=name)


@router.post("/backends/{name}/drain", response_model=BackendDrained, responses=errors(404))
async def drain_backend(
    name: str,
    request: Request,
    wait: float = Query(0.0, ge=0, le=3600, description="seconds to wait for in-flight calls"),
) -> BackendDrained:
    """Take no new requests on ``name``; its trajectories move at their next call."""
    llm_router = _router(request)
    _state(llm_router, name)
    llm_router.drain(name)
    drained = await llm_router.wait_drained(name, wait) if wait else llm_router.outstanding(name) == 0
    return BackendDrained(backend=_state(llm_router, name), drained=drained)


@router.post("/backends/{name}/undrain", response_model=BackendUndrained, responses=errors(404))
async def undrain_backend(name: str, request: Request) -> BackendUndrained:
    """Let ``name`` take new requests again."""
    llm_router = _router(request)
    _state(llm_router, name)
    return BackendUndrained(backend=BackendState.model_validate(llm_router.undrain(name)))


@router.post("/pause", response_model=Paused)
async def pause(body: PauseRequest, request: Request) -> Paused:
    """Hold new LLM calls (around a weight update)."""
    paused = await _router(request).pause(body.mode, timeout=body.timeout, forward=body.forward)
    return Paused.model_validate(paused)


@router.post("/resume", response_model=Resumed, responses=errors(409))
async def resume(body: ResumeRequest, request: Request) -> Resumed:
    """Let LLM calls go again, stamped with ``policy_version`` from now on.

    409 naming ``policy_version`` (generation stays paused) for a version below the one
    in force, unless ``allow_lower_version``: turns stamped lower than turns sampled
    before them would pass for older weights (staleness checks, off-policy corrections)."""
    try:
        resumed = Resumed.model_validate(
            await _router(request).resume(body.policy_version, allow_lower=body.allow_lower_version)
        )
    except LowerPolicyVersion as exc:
        raise FieldHTTPError(409, "policy_version", str(exc)) from exc
    except WeightsRefused as exc:
        raise HTTPException(409, str(exc)) from exc
    await _keep_weights(request, f"resumed at policy version {resumed.policy_version}")
    return resumed


@router.post("/weights", response_model=WeightsLoaded, responses=errors(409))
async def load_weights(body: WeightsRequest, request: Request) -> WeightsLoaded:
    """Load a LoRA adapter or full weights into every token-level backend, while paused.

    409 (nothing loaded) unless generation is paused with nothing in flight and every
    token-level backend can take them. A load that fails on a server is reported in
    ``outcomes`` (``ok`` false): resume only once every backend holds the new weights
    (load again, or remove the failing backend), else turns would be stamped with a
    version that did not make them."""
    llm_router = _router(request)
    weights = body.weights
    update = WeightUpdate(kind=weights.kind, path=weights.path, name=weights.name, policy_version=body.policy_version)
    try:
        outcomes = await llm_router.load_weights(update, timeout=body.timeout)
    except WeightsRefused as exc:
        raise HTTPException(409, str(exc)) from exc
    if any(o == "ok" for o in outcomes.values()):  # it took: the weights in force changed
        await _keep_weights(request, f"{weights.kind} weights loaded ({outcomes})")
    models: dict[str, str | None] = {}
    for name in outcomes:
        backend = llm_router.get(name) if llm_router.is_registered(name) else None
        models[name] = backend.loaded_model() if isinstance(backend, LoadsWeights) else None
    return WeightsLoaded(
        ok=all(o == "ok" for o in outcomes.values()),
        kind=weights.kind,
        outcomes=outcomes,
        models=models,
        policy_version=llm_router.policy_version,
    )

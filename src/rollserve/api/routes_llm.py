"""Inference backends at runtime: add, list, drain, remove; pause and resume generation.

A weight update from the trainer's side:

    POST /v1/llm/pause   {"mode": "finish"}     # returns once calls in flight are done
    ... load the new weights into the inference servers ...
    POST /v1/llm/resume  {"policy_version": 2}  # turns sampled from now on say 2
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from rollserve.api.errors import FieldHTTPError, errors
from rollserve.api.guards import StrictJSONRoute
from rollserve.llm.backends.factory import RemoteBackendSpec, backend_from_spec
from rollserve.validation import INT64_MAX

router = APIRouter(prefix="/v1/llm", tags=["llm"], route_class=StrictJSONRoute)


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["finish", "abort"] = Field(
        "finish", description="finish: calls in flight complete first; abort: they are "
                              "aborted and sent again after resume")
    timeout: float | None = Field(None, ge=0, le=3600,
                                  description="seconds to wait for calls in flight (finish)")
    forward: bool | None = Field(None, description="also pause the servers that support it "
                                                   "(default: the server's setting)")


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy_version: int | None = Field(None, ge=0, le=INT64_MAX,
                                       description="stamped on every turn sampled from now on")


def _router(request: Request):
    return request.app.state.service.router


def _known(llm_router, name: str) -> None:
    if not any(b["name"] == name for b in llm_router.list()):
        raise HTTPException(404, f"no backend named {name!r}")


@router.get("/backends")
async def list_backends(request: Request) -> dict:
    """Every backend with its health, load (outstanding, sessions) and draining state."""
    llm_router = _router(request)
    return {"backends": llm_router.list(), "router": llm_router.status()}


@router.get("/status")
async def status(request: Request) -> dict:
    return _router(request).status()


@router.post("/backends", status_code=201, responses=errors(409))
async def add_backend(spec: RemoteBackendSpec, request: Request) -> dict:
    """Add an inference server by URL; rollouts waiting for one start at once.

    Embedded (in-process) backends are started from the command line only: they load
    a model file from the server's disk."""
    llm_router = _router(request)
    try:
        backend = backend_from_spec(spec.spec())
    except ValueError as exc:
        raise FieldHTTPError(422, "url", str(exc)) from exc
    if any(b["name"] == backend.name for b in llm_router.list()):
        await backend.close()
        raise HTTPException(409, f"a backend named {backend.name!r} exists; remove it first")
    llm_router.add(backend)
    return {"backend": backend.describe()}


@router.delete("/backends/{name}", responses=errors(404))
async def remove_backend(
    name: str, request: Request,
    grace: float = Query(0.0, ge=0, le=3600, description="seconds for calls in flight to finish"),
) -> dict:
    llm_router = _router(request)
    _known(llm_router, name)
    await llm_router.remove(name, grace=grace)
    return {"removed": name}


@router.post("/backends/{name}/drain", responses=errors(404))
async def drain_backend(
    name: str, request: Request,
    wait: float = Query(0.0, ge=0, le=3600, description="seconds to wait for in-flight calls"),
) -> dict:
    """Take no new requests on ``name``; its trajectories move at their next call."""
    llm_router = _router(request)
    _known(llm_router, name)
    llm_router.drain(name)
    drained = await llm_router.wait_drained(name, wait) if wait else llm_router.outstanding(name) == 0
    return {"backend": next(b for b in llm_router.list() if b["name"] == name), "drained": drained}


@router.post("/backends/{name}/undrain", responses=errors(404))
async def undrain_backend(name: str, request: Request) -> dict:
    llm_router = _router(request)
    _known(llm_router, name)
    return {"backend": llm_router.undrain(name)}


@router.post("/pause")
async def pause(body: PauseRequest, request: Request) -> dict:
    return await _router(request).pause(body.mode, timeout=body.timeout, forward=body.forward)


@router.post("/resume")
async def resume(body: ResumeRequest, request: Request) -> dict:
    return await _router(request).resume(body.policy_version)

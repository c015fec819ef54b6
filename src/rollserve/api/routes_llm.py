"""Register, list and remove inference backends at runtime."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request

from rollserve.errors import InfraError
from rollserve.llm.factory import BackendSpec, backend_from_spec

router = APIRouter(prefix="/v1/llm", tags=["llm"])


def _known(llm_router, name: str) -> bool:
    return any(b["name"] == name for b in llm_router.list())


@router.get("/backends")
async def list_backends(request: Request) -> dict:
    return {"backends": request.app.state.service.router.list()}


@router.post("/backends", status_code=201)
async def add_backend(spec: BackendSpec, request: Request) -> dict:
    """Add an inference backend; rollouts waiting for one start at once."""
    service = request.app.state.service
    try:
        backend = backend_from_spec(spec.model_dump(exclude_none=True))
    except (ValueError, InfraError) as exc:  # InfraError: e.g. the embedded extra is missing
        raise HTTPException(422, f"{spec.kind}: {exc}") from exc
    if _known(service.router, backend.name):
        raise HTTPException(409, f"a backend named {backend.name!r} exists; remove it first")
    service.router.add(backend)
    return {"backend": backend.describe()}


@router.delete("/backends/{name}")
async def remove_backend(name: str, request: Request) -> dict:
    service = request.app.state.service
    if not _known(service.router, name):
        raise HTTPException(404, f"no backend named {name!r}")
    await service.router.remove(name)
    return {"removed": name}

"""The HTTP API (FastAPI): the trainer's way in."""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rollserve import __version__
from rollserve.api.metrics import router as metrics_router
from rollserve.api.prorl import ProRLCompat, ProRLConfig
from rollserve.api.prorl import router as prorl_router
from rollserve.api.routes_llm import router as llm_router
from rollserve.api.routes_rollouts import router as rollouts_router
from rollserve.engine.submit import SubmitError
from rollserve.errors import QueueFullError
from rollserve.server import Service
from rollserve.validation import field_name


def create_app(service: Service, manage_lifecycle: bool = True,
               prorl: ProRLConfig | None = None) -> FastAPI:
    """The app; ``prorl`` also serves ProRL Agent's routes (``api.prorl``)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    token = service.config.api_token

    async def require_token(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), token):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    app = FastAPI(title="rollserve", version=__version__, lifespan=lifespan)
    app.state.service = service
    app.include_router(rollouts_router, dependencies=[Depends(require_token)])
    app.include_router(llm_router, dependencies=[Depends(require_token)])
    app.include_router(metrics_router, dependencies=[Depends(require_token)])
    if prorl is not None:
        app.state.prorl = ProRLCompat(prorl)
        app.include_router(prorl_router, dependencies=[Depends(require_token)])

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict:
        return {"ok": True, "version": __version__}

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": field_name(e.get("loc", ())), "message": e.get("msg", ""),
             "type": e.get("type", "")}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse(status_code=422, content={"detail": summary, "errors": errors})

    @app.exception_handler(SubmitError)
    async def on_submit_error(request: Request, exc: SubmitError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content={"detail": str(exc), "errors": [{"field": exc.field, "message": exc.message}]},
        )

    @app.exception_handler(QueueFullError)
    async def on_queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        return JSONResponse(
            status_code=429,
            content={"detail": str(exc), "retry_after": exc.retry_after},
            headers={"Retry-After": str(max(1, round(exc.retry_after)))},
        )

    return app

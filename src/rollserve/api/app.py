"""The HTTP API (FastAPI): the trainer's way in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from rollserve import __version__
from rollserve.api import log_redact
from rollserve.api.base import ApiService
from rollserve.api.errors import SafeJSONResponse, install_error_handlers
from rollserve.api.guards import (
    DOCS_PATHS,
    PUBLIC_PATHS,
    BodyLimit,
    TokenGuard,
    conform_schema,
)
from rollserve.api.metrics import metrics_registry
from rollserve.api.metrics import router as metrics_router
from rollserve.api.prorl import ProRLCompat, ProRLConfig
from rollserve.api.prorl import router as prorl_router
from rollserve.api.routes_gateway import PREFIX as GATEWAY_PREFIX
from rollserve.api.routes_gateway import HarnessRoutes
from rollserve.api.routes_gateway import router as gateway_router
from rollserve.api.routes_llm import router as llm_router
from rollserve.api.routes_rollouts import router as rollouts_router
from rollserve.api.routes_ui import UI_PATH, UI_PREFIX
from rollserve.api.routes_ui import pages as ui_pages
from rollserve.api.routes_ui import router as ui_router
from rollserve.contract import Health


def create_app(service: ApiService, manage_lifecycle: bool = True, prorl: ProRLConfig | None = None) -> FastAPI:
    """The app; ``prorl`` also serves ProRL Agent's routes (``api.prorl``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_redact.install()  # again: the server configured its logging meanwhile
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    log_redact.install()  # gateway keys never reach the access log
    config = service.config
    app = FastAPI(title="rollserve", version=__version__, lifespan=lifespan, default_response_class=SafeJSONResponse)
    app.state.service = service
    app.state.metrics = metrics_registry(service)
    app.include_router(ui_router)  # before rollouts_router: /v1/results/summaries
    app.include_router(rollouts_router)
    app.include_router(ui_pages)
    app.include_router(llm_router)
    app.include_router(metrics_router)
    app.include_router(gateway_router)
    if prorl is not None:
        app.state.prorl = ProRLCompat(prorl)
        app.include_router(prorl_router)

    @app.get("/healthz", tags=["service"], response_model=Health)
    async def healthz() -> Health:
        return Health(ok=True, version=__version__)

    install_error_handlers(app)
    # Middleware added last runs first: the token is checked before the body is read,
    # the body's size before a harness's call (innermost) is served.
    app.add_middleware(HarnessRoutes)
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_request_bytes)
    public = PUBLIC_PATHS + (UI_PATH,) + (DOCS_PATHS if config.public_docs else ())
    if config.api_token is not None:
        # A harness's gateway paths carry its session key instead of the API token; the
        # dashboard's static files hold no data (its API calls carry the token).
        app.add_middleware(
            TokenGuard, token=config.api_token, public=public, public_prefixes=(GATEWAY_PREFIX, UI_PREFIX)
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = conform_schema(FastAPI.openapi(app), config.api_token is not None, public)
        return app.openapi_schema

    # FastAPI's documented way to customise the schema is to replace this method.
    app.openapi = openapi  # type: ignore[method-assign]
    return app

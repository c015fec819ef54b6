"""What the API needs of the service it serves: the routes' contract.

The routes reach the service as ``request.app.state.service`` (``service_of``) and
depend only on ``ApiService``: what they read and call of it, typed. The composition
root (``rollserve.server.Service``) satisfies it; mypy checks that where the commands
hand a ``Service`` to ``api.app.create_app`` and ``api.serving.serve``. Nothing in
``api`` imports the composition root.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import Metric
from starlette.requests import HTTPConnection

from rollserve.contract import SandboxStatus
from rollserve.engine.facade import Rollouts
from rollserve.engine.gateway import Gateways
from rollserve.engine.requests import RequestLimits
from rollserve.llm.routing import Router
from rollserve.llm.tokens import BackendTokenizer, ChatTokenizer

__all__ = ["ApiConfig", "ApiService", "EngineStats", "MetricSource", "service_of"]


class ApiConfig(Protocol):
    """The settings the app reads when it is built."""

    @property
    def api_token(self) -> str | None:
        """The bearer token every trainer route requires (None: no token)."""
        ...

    @property
    def public_docs(self) -> bool:
        """With a token: /openapi.json and the docs pages are served without it."""
        ...

    @property
    def limits(self) -> RequestLimits:
        """The request limits (the body size the guard admits, ``max_request_bytes``)."""
        ...


class MetricSource(Protocol):
    """Prometheus metrics kept as they happen (histograms), read when scraped."""

    def collect(self) -> Iterator[Metric]: ...


class JudgeSource(Protocol):
    """The server's judges (``llm.judges.Judges``): their state and metrics."""

    def describe(self) -> list[dict[str, Any]]: ...

    def collect(self) -> Iterator[Metric]: ...


class EngineStats(Protocol):
    """What ``/metrics`` reads of the engine itself."""

    @property
    def masked(self) -> Mapping[tuple[str, str], int]:
        """Masked rollouts so far, by (failure kind, stage)."""
        ...

    @property
    def latency(self) -> MetricSource:
        """The per-stage wait and run time histograms."""
        ...


class ApiService(Protocol):
    """The service as the routes, the metrics and the server's lifecycle use it."""

    @property
    def config(self) -> ApiConfig: ...

    @property
    def rollouts(self) -> Rollouts:
        """Submit, wait for, read and cancel rollouts; the service's status."""
        ...

    @property
    def gateways(self) -> Gateways:
        """The gateway's operations (a harness's calls, a rollout's session)."""
        ...

    @property
    def router(self) -> Router:
        """The LLM backends: list, add, drain, pause, load weights."""
        ...

    @property
    def engine(self) -> EngineStats: ...

    @property
    def judges(self) -> JudgeSource:
        """The judges called at EVAL (outside the router)."""
        ...

    @property
    def tokenizer(self) -> ChatTokenizer | BackendTokenizer:
        """The policy's tokenizer (the dashboard's token texts)."""
        ...

    @property
    def weights_path(self) -> Path:
        """Where the weights in force are recorded for a restart."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def save_weights(self) -> None:
        """Record the weights in force; ``OSError`` when they could not be written."""
        ...

    def sandbox_status(self) -> SandboxStatus:
        """The sandbox runtime's status (and what the start-up reaper cleaned up)."""
        ...

    def begin_shutdown(self) -> None:
        """A shutdown signal came: long-polls and event streams end now."""
        ...


def service_of(connection: HTTPConnection) -> ApiService:
    """The service the app serves (``create_app`` put it in the app's state)."""
    service: ApiService = connection.app.state.service
    return service

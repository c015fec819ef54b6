"""Every error the API answers, in one shape, and how the schema declares it.

Each 4xx body is an ``ErrorBody``: ``detail`` says what is wrong in one line;
``errors`` (when a field is at fault) names each field, as the user wrote it
(``tasks[1].instance.question``). Routes declare their errors with ``errors(...)``;
``api.guards`` adds what applies to every route (401, 413, 422). The engine's typed
refusals (``engine.errors``) become status codes here, in one table (``STATUS``).

Responses are rendered so that nothing a client sent, nor anything a policy
produced, can turn them into a 500: a lone surrogate is escaped, a non-finite
number becomes null (``SafeJSONResponse``); big bodies render on a thread
(``json_response``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticSerializationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollserve.api.log_redact import redact
from rollserve.contract.validation import field_name
from rollserve.engine.errors import (
    BatchTooLarge,
    Conflict,
    EngineError,
    InvalidTask,
    NotFound,
    QueueFull,
    StillRunning,
    UnknownDataSource,
)

log = logging.getLogger(__name__)


class FieldError(BaseModel):
    """One field at fault, named as the user wrote it."""

    field: str = Field(description="the field at fault, as written in the request: tasks[0].n")
    message: str = Field(description="what is wrong with it")
    type: str | None = Field(None, description="pydantic's error type, when it found it")


class ErrorBody(BaseModel):
    """What every 4xx (and the documented 5xx) answers."""

    detail: str = Field(description="what is wrong, in one line")
    errors: list[FieldError] | None = Field(None, description="each field at fault")
    retry_after: float | None = Field(
        None, description="429: seconds before a retry may fit; 409 of a re-scoring still running: before asking again"
    )


_DESCRIPTIONS = {
    400: "Bad request: an unknown data_source (rollouts), or as ProRL's server answers",
    401: "Missing or wrong bearer token",
    404: "No such rollout, group or backend (unknown, or past retention)",
    409: "Conflict: the id or name is taken by something else",
    413: "The request body is larger than the server's limit (--max-request-mb)",
    422: "Invalid input: each field at fault is named",
    429: "Not enough free rollout slots now; retry after Retry-After seconds",
    503: "ProRL: the server is not started, or has no LLM server",
    504: "ProRL: the job outlived its wait (it is cancelled)",
}


# The engine's refusals as HTTP statuses: the most specific class listed wins.
STATUS: dict[type[EngineError], int] = {
    NotFound: 404,
    UnknownDataSource: 400,
    Conflict: 409,
    BatchTooLarge: 422,
    InvalidTask: 422,
    QueueFull: 429,
}


def status_of(kind: type[EngineError]) -> int:
    """The HTTP status of a kind of the engine's refusals."""
    for cls in kind.__mro__:
        if cls in STATUS:
            return STATUS[cls]
    raise TypeError(f"no HTTP status for {kind.__name__}: add it to api.errors.STATUS")


def error_response(code: int, description: str | None = None) -> dict[str, Any]:
    """The schema of one error status, for a route's ``responses=``."""
    declared: dict[str, Any] = {"model": ErrorBody, "description": description or _DESCRIPTIONS[code]}
    if code == 429:
        declared["headers"] = {
            "Retry-After": {
                "description": "seconds to wait before retrying",
                "schema": {"type": "integer", "minimum": 1},
            }
        }
    if code == 401:
        declared["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return declared


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that may answer ``codes``."""
    return {code: error_response(code) for code in codes}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render_json(content: Any) -> bytes:
    """``content`` as UTF-8 JSON, whatever strings and numbers it holds."""
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, the text stays valid JSON
        return json.dumps(_finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
    except ValueError:  # NaN or an infinity: not JSON; null instead
        return render_json(_finite(content))


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return render_json(content)


async def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON response rendered on a thread: results can be megabytes of token ids."""
    body = await asyncio.to_thread(render_json, content)
    return Response(body, status_code=status_code, media_type="application/json")


def render_model(model: BaseModel, exclude_unset: bool = False) -> bytes:
    """``model`` as UTF-8 JSON (pydantic's serializer; ``render_json`` for what it
    refuses: a lone surrogate)."""
    try:
        return model.model_dump_json(exclude_unset=exclude_unset).encode("utf-8")
    except PydanticSerializationError:
        return render_json(model.model_dump(mode="json", exclude_unset=exclude_unset))


async def model_response(model: BaseModel, status_code: int = 200, exclude_unset: bool = False) -> Response:
    """A response of ``model`` (the route's declared ``response_model``), rendered on a
    thread: results can be megabytes of token ids."""
    body = await asyncio.to_thread(render_model, model, exclude_unset)
    return Response(body, status_code=status_code, media_type="application/json")


class FieldHTTPError(HTTPException):
    """An HTTP error that names the field at fault (or, with ``found``, each of them)."""

    def __init__(
        self,
        status_code: int,
        field: str,
        message: str,
        headers: dict[str, str] | None = None,
        found: list[dict[str, str]] | None = None,
    ):
        self.found = found or [{"field": field, "message": message}]
        super().__init__(status_code, _summary(self.found), headers)
        self.field = field
        self.message = message

    @classmethod
    def invalid(cls, error: ValidationError) -> FieldHTTPError:
        """A 422 for pydantic's ``error``."""
        found = _found(error.errors())
        return cls(422, found[0]["field"], found[0]["message"], found=found)


def _found(errors_: list[Any]) -> list[dict[str, str]]:
    return [
        {"field": field_name(e.get("loc", ())), "message": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in errors_
    ]


def _summary(found: list[dict[str, str]]) -> str:
    return "; ".join(f"{e['field']}: {e['message']}" for e in found)


def _body(detail: str, errors_: list[dict[str, str]] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"detail": detail}
    if errors_ is not None:
        body["errors"] = errors_
    return {**body, **extra}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        found = _found(list(exc.errors()))
        return SafeJSONResponse(_body(_summary(found), found), status_code=422)

    @app.exception_handler(EngineError)
    async def on_engine_error(request: Request, exc: EngineError) -> Response:
        return engine_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        found = exc.found if isinstance(exc, FieldHTTPError) else None
        if exc.status_code == 500:
            log.warning("%s %s answered %d: %s", request.method, redact(request.url.path), exc.status_code, exc.detail)
        headers = exc.headers
        if exc.status_code == 405:  # Starlette names one route's methods; the path has more
            methods = allowed_methods(request)
            if methods:
                headers = {**(headers or {}), "Allow": ", ".join(methods)}
        return SafeJSONResponse(_body(str(exc.detail), found), status_code=exc.status_code, headers=headers)


def engine_error_response(exc: EngineError) -> Response:
    """The answer to one of the engine's refusals."""
    found = None if exc.field is None else [{"field": exc.field, "message": exc.message}]
    if isinstance(exc, QueueFull | StillRunning):
        return SafeJSONResponse(
            _body(str(exc), found, retry_after=exc.retry_after),
            status_code=status_of(type(exc)),
            headers={"Retry-After": str(max(1, round(exc.retry_after)))},
        )
    return SafeJSONResponse(_body(str(exc), found), status_code=status_of(type(exc)))


def allowed_methods(request: Request) -> list[str]:
    """The methods the published schema gives the request's path (a 405's ``Allow``)."""
    app = request.app
    patterns = getattr(app.state, "path_methods", None)
    if patterns is None:
        patterns = []
        for template, operations in app.openapi().get("paths", {}).items():
            regex = "^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(template)) + "$"
            patterns.append((re.compile(regex), {m.upper() for m in operations}))
        app.state.path_methods = patterns
    found: set[str] = set()
    for pattern, methods in patterns:
        if pattern.match(request.url.path):
            found |= methods
    return sorted(found)

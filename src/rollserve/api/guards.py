"""What stands between a request and the routes: the bearer token, the body size
limit, strict JSON; and the schema entries they add to every route.

- ``TokenGuard``: with ``--api-token``, every path but ``/healthz`` (and the docs, if
  ``--public-docs``, and the gateway's ``/v1/gateway/<key>/...``, where the session key
  is the credential) needs ``Authorization: Bearer <token>``, checked before the body
  is read. Compared as bytes: a header in any encoding is a 401, never an error.
- ``BodyLimit``: a body past ``max_request_bytes`` is a 413, from its
  Content-Length before anything is read, or as soon as a streamed body passes it.
- ``StrictJSONRoute``: request bodies are parsed by ``rollserve.validation.parse_json``
  (no NaN, no lone surrogates, bounded depth, 64-bit integers; a 422 naming the
  field otherwise), on a thread when they are large.
- ``conform_schema``: /openapi.json declares what these answer (401, 413, 422 as
  ``ErrorBody``) and the bearer scheme, so responses match the published schema.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollserve.api.errors import (
    ErrorBody,
    FieldError,
    FieldHTTPError,
    SafeJSONResponse,
    error_response,
)
from rollserve.validation import JSONInputError, field_name, parse_json

UNAUTHORIZED = "missing or wrong bearer token: send 'Authorization: Bearer <token>'"
DOCS_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
PUBLIC_PATHS = ("/healthz",)
_THREAD_PARSE_BYTES = 256 * 1024  # bodies above this are parsed off the event loop


class TokenGuard:
    """A 401 for every request without the bearer token, except on ``public`` paths and
    paths under ``public_prefixes``."""

    def __init__(self, app: ASGIApp, token: str, public: tuple[str, ...], public_prefixes: tuple[str, ...] = ()):
        self.app = app
        self.token = token.encode("utf-8")
        self.public = frozenset(public)
        self.public_prefixes = public_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self.public
            or scope["path"].startswith(self.public_prefixes)
            or self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        response = SafeJSONResponse({"detail": UNAUTHORIZED}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.strip().partition(b" ")
                return scheme.lower() == b"bearer" and secrets.compare_digest(given.strip(), self.token)
        return False


class BodyTooLarge(FieldHTTPError):
    def __init__(self, limit: int):
        super().__init__(413, "body", f"larger than the server's limit of {limit} bytes (--max-request-mb)")


class BodyLimit:
    """A 413 for a request body past ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                error = BodyTooLarge(self.max_bytes)
                body = ErrorBody(detail=error.detail, errors=[FieldError(field="body", message=error.message)])
                await SafeJSONResponse(body.model_dump(exclude_none=True), status_code=413)(scope, receive, send)
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's body read: FastAPI passes HTTP errors on.
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)


_UNPARSED = object()  # (a body may be JSON's null: None cannot say "not parsed yet")


class StrictJSONRequest(Request):
    """A request whose ``json()`` is ``parse_json``'s, then checked against the route's
    body model in strict mode: the types the schema publishes, no coercion ("1" is
    not a number, 0 is not false). The value is parsed once and kept in an attribute
    of this class's own (Starlette's cache of ``json()`` is private to it)."""

    def __init__(self, scope: Scope, receive: Receive, body_type: TypeAdapter[Any] | None):
        super().__init__(scope, receive)
        self._body_type = body_type
        self._strict_json: Any = _UNPARSED

    async def json(self) -> Any:
        if self._strict_json is _UNPARSED:
            raw = await self.body()
            try:
                if len(raw) > _THREAD_PARSE_BYTES:
                    value = await asyncio.to_thread(parse_json, raw)
                else:
                    value = parse_json(raw)
            except JSONInputError as exc:
                raise FieldHTTPError(422, field_name(exc.loc), exc.message) from None
            if self._body_type is not None:
                try:
                    self._body_type.validate_python(value, strict=True)
                except ValidationError as exc:
                    raise FieldHTTPError.invalid(exc) from None
            self._strict_json = value
        return self._strict_json


class StrictJSONRoute(APIRoute):
    """A route whose JSON body is parsed by ``parse_json`` and validated strictly."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        field = self.body_field
        annotation = None if field is None else field.field_info.annotation
        body_type = None if annotation is None else TypeAdapter(annotation)

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive, body_type))

        return strict


def conform_schema(schema: dict[str, Any], token: bool, public: tuple[str, ...]) -> dict[str, Any]:
    """Declare in ``schema`` (FastAPI's /openapi.json) what the guards answer."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name, model in (("ErrorBody", ErrorBody), ("FieldError", FieldError)):
        if name not in schemas:
            found = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for def_name, definition in found.pop("$defs", {}).items():
                schemas.setdefault(def_name, definition)
            schemas[name] = found
    error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    if token:
        components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if "422" in responses:  # FastAPI's default says HTTPValidationError; ours differ
                responses["422"] = {"description": error_response(422)["description"], "content": error_ref}
            responses["413"] = {
                "description": error_response(413)["description"],  # any body
                "content": error_ref,
            }
            if token and path not in public:
                responses["401"] = {
                    "description": error_response(401)["description"],
                    "headers": error_response(401)["headers"],
                    "content": error_ref,
                }
                operation["security"] = [{"bearer": []}]
    for unused in ("HTTPValidationError", "ValidationError"):  # every 422 refers to ErrorBody
        schemas.pop(unused, None)
    return schema

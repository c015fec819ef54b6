"""The recording gateway's routes: OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages for an unmodified harness.

A harness sets ``OPENAI_BASE_URL=<server>/v1/gateway/<key>/v1`` (any API key: the key
in the path is what names the session, and these paths need no ``--api-token``) and
calls ``POST .../chat/completions`` as it would call OpenAI, with ``stream`` true or
not; or ``ANTHROPIC_BASE_URL=<server>/v1/gateway/<key>`` and ``POST .../v1/messages``
(Anthropic's shapes, events and error shape: ``agent.gateway.anthropic_wire``) and
``POST .../v1/messages/count_tokens`` (the policy tokenizer's exact count);
``POST .../responses`` (OpenAI Responses: ``agent.gateway.responses_wire``) and
``GET .../models``;
``POST /v1/gateway/<key>/end`` says it is done. Refusals are OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``): 400 for a bad request (``param``
names the field) or a prompt past the context limit (``context_length_exceeded``), 401
for an unknown key, 404 for a session that has ended, 408 at the time limit, 413 for a
body past the session's bound, 429 past its calls in progress, 502 when the backend
failed. What is checked, in order: the key (401) and the session's admission (404,
429) before a byte of the body is read; the body's size (413, from Content-Length
or while it is read); its parse (400: on the event loop up to
``wire.INLINE_BYTES``, in a thread above); the prompt's size from its
rendered bytes, before it is tokenized (400 ``context_length_exceeded``). The trainer reads a rollout's key from
``GET /v1/rollouts/{id}/gateway`` (behind the API token like every trainer route).
The wire itself (parsing, answers, chunks) is ``agent.gateway.wire``'s, as the engine
re-exports it. The harness's paths are served by ``HarnessRoutes`` (a middleware, not
FastAPI's router: a model call's path is the hot one); the trainer's
``/v1/rollouts/{id}/gateway`` is a FastAPI route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeAlias, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from rollserve.api.base import service_of
from rollserve.api.errors import errors, model_response, render_model
from rollserve.api.guards import BodyTooLarge as ServerBodyTooLarge
from rollserve.contract import MAX_WAIT
from rollserve.contract.anthropic import MessagesRequest
from rollserve.contract.gateway import ChatCompletionRequest, GatewayInfo
from rollserve.contract.responses import ResponsesRequest
from rollserve.engine.gateway import (
    BodyTooLarge,
    GatewayRefusal,
    GatewayReply,
    Gateways,
    GatewaySession,
    anthropic_wire,
    responses_wire,
    wire,
)
from rollserve.engine.priority import enter_background

T = TypeVar("T")

PREFIX = "/v1/gateway/"  # the harness's paths: no API token (the key is the credential)

router = APIRouter(tags=["gateway"])


def _gateways(request: Request) -> Gateways:
    return service_of(request).gateways


def _refused(refusal: GatewayRefusal, body: bytes | None = None) -> Response:
    """``refusal`` with the status the wire's one table gives its kind (``wire.ERRORS``,
    as the sandbox's socket answers it); ``body`` (OpenAI's shape unless given)."""
    return Response(
        wire.error_body(refusal) if body is None else body,
        status_code=wire.status(refusal),
        media_type="application/json",
    )


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the request body is larger than this session's limit of "
        f"{limit} bytes (from its context window: a prompt that fits "
        "it is smaller)"
    )


async def _body(request: Request, limit: int) -> bytes:
    """The body, never more than ``limit`` bytes of it read: a 413 from its
    Content-Length before anything is read, or as soon as it passes the limit."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ServerBodyTooLarge as exc:  # the server's own bound (guards.BodyLimit) came first
        raise BodyTooLarge(f"the request body is {exc.message}") from None
    return b"".join(chunks)


async def _answer(answer: GatewayReply, size: int, body: Callable[[], BaseModel]) -> Response:
    """A non-streamed answer's body, made and rendered where its size says (``wire.sized``;
    ``size``: the request's bytes)."""
    rendered = await wire.sized(wire.answer_size(answer, size), lambda: render_model(body()))
    return Response(rendered, media_type="application/json")


async def _stream(answer: GatewayReply, size: int, events: Callable[[], Iterable[bytes]]) -> Response:
    """A streamed answer's events, made where their size says (``wire.sized``)."""
    made = await wire.sized(wire.answer_size(answer, size), lambda: list(events()))
    return StreamingResponse(iter(made), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _admitted(request: Request, key: str, call: Callable[[GatewaySession, bytes], Awaitable[T]]) -> T:
    """``call(session, body)`` for the session ``key`` names, in this order: the key
    (401) and the session's admission (429, 404 when it ended) before a byte of the
    body is read, the body under the session's size bound (413), then ``call``."""
    session = _gateways(request).session(key)
    with session.admitted():
        return await call(session, await _body(request, session.max_body_bytes))


async def chat_completions(key: str, request: Request) -> Response:
    """One model call of the harness (OpenAI Chat Completions; ``stream: true`` answers
    ``chat.completion.chunk`` server-sent events, then ``data: [DONE]``)."""

    async def call(session: GatewaySession, raw: bytes) -> tuple[ChatCompletionRequest, GatewayReply, int]:
        parsed = await wire.sized(len(raw), wire.parse_request, raw)
        return parsed, await _gateways(request).complete(session, parsed, size=len(raw)), len(raw)

    try:
        parsed, answer, size = await _admitted(request, key, call)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    if parsed.stream:
        return await _stream(answer, size, lambda: wire.stream_chunks(answer, parsed))
    return await _answer(answer, size, lambda: wire.completion(answer, parsed.model))


async def messages(key: str, request: Request) -> Response:
    """One model call of the harness (Anthropic Messages; ``stream: true`` answers
    Anthropic's server-sent events, ``message_start`` to ``message_stop``)."""

    async def call(session: GatewaySession, raw: bytes) -> tuple[MessagesRequest, GatewayReply, int]:
        parsed, chat = await wire.sized(len(raw), anthropic_wire.parse_request, raw)
        return parsed, await _gateways(request).complete(session, chat, anthropic_wire.CALL_IDS, len(raw)), len(raw)

    try:
        parsed, answer, size = await _admitted(request, key, call)
    except GatewayRefusal as refusal:
        return _refused(refusal, anthropic_wire.error_body(refusal))
    if parsed.stream:
        return await _stream(answer, size, lambda: anthropic_wire.events(answer, parsed.model))
    return await _answer(answer, size, lambda: anthropic_wire.message(answer, parsed.model))


async def responses(key: str, request: Request) -> Response:
    """One model call of the harness (OpenAI Responses; ``stream: true`` answers the
    Responses server-sent events, ``response.created`` to ``response.completed``)."""

    async def call(session: GatewaySession, raw: bytes) -> tuple[ResponsesRequest, GatewayReply, int]:
        parsed, chat = await wire.sized(len(raw), responses_wire.parse_request, raw)
        return parsed, await _gateways(request).complete(session, chat, responses_wire.CALL_IDS, len(raw)), len(raw)

    try:
        parsed, answer, size = await _admitted(request, key, call)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    if parsed.stream:
        return await _stream(answer, size, lambda: responses_wire.events(answer, parsed))
    return await _answer(answer, size, lambda: responses_wire.response(answer, parsed))


async def models(key: str, request: Request) -> Response:
    """The model the gateway lists (a call may name any: the policy answers it)."""
    try:
        _gateways(request).session(key)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    return await model_response(responses_wire.models())


async def count_tokens(key: str, request: Request) -> Response:
    """Anthropic's token count of a Messages request: its whole render with the policy's
    chat template, counted by its tokenizer (nothing sampled, nothing recorded)."""

    async def call(session: GatewaySession, raw: bytes) -> int:
        _, chat = await wire.sized(len(raw), anthropic_wire.parse_count_request, raw)
        return await _gateways(request).count_tokens(session, chat, len(raw))

    try:
        tokens = await _admitted(request, key, call)
    except GatewayRefusal as refusal:
        return _refused(refusal, anthropic_wire.error_body(refusal))
    return Response(anthropic_wire.count_body(tokens), media_type="application/json")


class Ended(BaseModel):
    """The harness's session has ended."""

    ended: bool


async def end(key: str, request: Request) -> Response:
    """The harness is done: the rollout's RUN ends and its EVAL grades the episode."""
    try:
        _gateways(request).end(key)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    return await model_response(Ended(ended=True))


@router.get("/v1/rollouts/{rollout_id}/gateway", response_model=GatewayInfo, tags=["rollouts"], responses=errors(404))
async def gateway_info(
    rollout_id: str,
    request: Request,
    wait: float = Query(
        0.0, ge=0.0, le=MAX_WAIT, description=("seconds to wait for the rollout's RUN to open its session")
    ),
) -> Response:
    """The rollout's gateway key and the base URL its harness uses (404 until its RUN
    opens the session, and after it ends)."""
    return await model_response(await _gateways(request).info(rollout_id, wait))


Route: TypeAlias = Callable[[str, Request], Awaitable[Response]]

# The harness's routes, by (method, the path after /v1/gateway/<key>/). They are
# OpenAI's and Anthropic's API (their errors are those shapes, not rollserve's
# ErrorBody), so /openapi.json leaves them out.
HARNESS_ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "v1/chat/completions"): chat_completions,
    ("POST", "v1/messages"): messages,
    ("POST", "v1/responses"): responses,
    ("GET", "v1/models"): models,
    ("POST", "v1/messages/count_tokens"): count_tokens,
    ("POST", "end"): end,
}


class HarnessRoutes:
    """Serves the harness's paths (``HARNESS_ROUTES``) straight from the ASGI call:
    a harness's every model call passes through here, so it skips FastAPI's routing
    (a match against each of the app's routes), its dependency solving and its
    exception middleware, which cost about a millisecond a call. Added as the
    innermost middleware: the server's body limit (``guards.BodyLimit``) and the
    500 of an unexpected error (Starlette's ``ServerErrorMiddleware``) still apply.
    Any other path (and a method a path does not take) goes on to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(PREFIX):
            enter_background()  # a harness's call is its rollout's work: after the trainer's requests
        route = self._route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        key, call = route
        response = await call(key, Request(scope, receive, send))
        await response(scope, receive, send)

    @staticmethod
    def _route(scope: Scope) -> tuple[str, Route] | None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PREFIX):
            return None
        key, _, rest = path[len(PREFIX) :].partition("/")
        call = HARNESS_ROUTES.get((scope["method"], rest)) if key else None
        return None if call is None else (key, call)

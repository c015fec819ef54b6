"""OpenAI's wire for the gateway: a request body in, an answer's bytes out.

Shared by the server's routes (``api.routes_gateway``) and a sandboxed harness's
socket (``agent.gateway.unix_socket``), so both speak exactly the same protocol. That
includes how a refusal is answered: ``ERRORS`` is the one table of each kind of
``GatewayRefusal``'s HTTP status and OpenAI error type, for both servers (the
session logic raises the kinds and knows no status).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

from pydantic import ValidationError

from rollserve.agent.gateway.base import (
    BackendFailed,
    BadRequest,
    BodyTooLarge,
    GatewayRefusal,
    SessionEnded,
    TimeLimit,
    TooManyCalls,
    UnknownKey,
    UnknownRoute,
)
from rollserve.agent.gateway.bounds import INLINE_BYTES, sized
from rollserve.agent.gateway.session import GatewayReply
from rollserve.agent.gateway.sliced import validate_sliced
from rollserve.contract.gateway import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    FunctionCall,
    GatewayError,
    GatewayErrorBody,
    ToolCallDelta,
    Usage,
)
from rollserve.contract.validation import JSONInputError, field_name, parse_json

__all__ = [
    "ERRORS",
    "INLINE_BYTES",
    "answer_size",
    "completion",
    "error_body",
    "parse_request",
    "sized",
    "status",
    "stream_chunks",
]

# Each kind of refusal as both servers answer it: HTTP status, OpenAI's error type.
# The most specific class listed wins (``ContextLengthExceeded`` is a ``BadRequest``).
ERRORS: dict[type[GatewayRefusal], tuple[int, str]] = {
    BadRequest: (400, "invalid_request_error"),
    UnknownKey: (401, "authentication_error"),
    SessionEnded: (404, "invalid_request_error"),
    UnknownRoute: (404, "invalid_request_error"),
    TimeLimit: (408, "timeout"),
    BodyTooLarge: (413, "invalid_request_error"),
    TooManyCalls: (429, "rate_limit_error"),
    BackendFailed: (502, "server_error"),
}


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _answer(refusal: GatewayRefusal) -> tuple[int, str]:
    for kind in type(refusal).__mro__:
        if kind in ERRORS:
            return ERRORS[kind]
    raise TypeError(f"no HTTP answer for {type(refusal).__name__}: add it to wire.ERRORS")


def status(refusal: GatewayRefusal) -> int:
    """The HTTP status ``refusal`` is answered with (``ERRORS``)."""
    return _answer(refusal)[0]


def error_body(refusal: GatewayRefusal) -> bytes:
    """``refusal`` in OpenAI's error shape."""
    body = GatewayErrorBody(
        error=GatewayError(message=refusal.message, type=_answer(refusal)[1], param=refusal.param, code=refusal.code)
    )
    return _json(body.model_dump(mode="json"))


def parse_request(raw: bytes) -> ChatCompletionRequest:
    """The request in ``raw``; ``BadRequest`` (``param`` naming the field) when it is
    not JSON rollserve can hold or not a chat request."""
    try:
        value = parse_json(raw)
    except JSONInputError as exc:
        raise BadRequest(exc.message, param=field_name(exc.loc)) from None
    try:
        return validate_sliced(ChatCompletionRequest, value)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = field_name(first["loc"])
        raise BadRequest(f"{param}: {first['msg']}", param=param) from None


def answer_size(answer: GatewayReply, request_bytes: int) -> int:
    """About how many bytes the answer's body takes, what ``sized`` decides its render's
    place by: its text and tool calls, plus the request's size, since an answer may
    repeat the request (a Responses answer carries its ``instructions`` and ``tools``,
    three times when streamed)."""
    calls = answer.reply.tool_calls
    reply = len(answer.reply.content or "") + sum(len(c.function.name) + len(c.function.arguments) for c in calls)
    return reply + request_bytes


def _usage(answer: GatewayReply) -> Usage:
    return Usage(
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        total_tokens=answer.prompt_tokens + answer.completion_tokens,
    )


def completion(answer: GatewayReply, model: str) -> ChatCompletion:
    """The answer as a ``chat.completion``."""
    message = AssistantMessage(content=answer.reply.content, tool_calls=answer.reply.tool_calls or None)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[Choice(message=message, finish_reason=answer.finish_reason)],
        usage=_usage(answer),
    )


def stream_chunks(answer: GatewayReply, request: ChatCompletionRequest) -> Iterator[bytes]:
    """The answer as OpenAI streams it (server-sent events): the role, the content, each
    tool call, the finish reason, the usage when asked for, then ``[DONE]``."""
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> bytes:
        body = ChatCompletionChunk(id=completion_id, created=created, model=request.model, choices=choices, usage=usage)
        return b"data: " + _json(body.model_dump(mode="json", exclude_none=True)) + b"\n\n"

    yield chunk([ChunkChoice(delta=Delta(role="assistant", content=""))])
    if answer.reply.content:
        yield chunk([ChunkChoice(delta=Delta(content=answer.reply.content))])
    for index, call in enumerate(answer.reply.tool_calls):
        yield chunk(
            [
                ChunkChoice(
                    delta=Delta(
                        tool_calls=[
                            ToolCallDelta(
                                index=index,
                                id=call.id,
                                type="function",
                                function=FunctionCall(name=call.function.name, arguments=call.function.arguments),
                            )
                        ]
                    )
                )
            ]
        )
    yield chunk([ChunkChoice(delta=Delta(), finish_reason=answer.finish_reason)])
    if request.stream_options is not None and request.stream_options.include_usage:
        yield chunk([], _usage(answer))
    yield b"data: [DONE]\n\n"

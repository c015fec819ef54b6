"""Anthropic's wire for the gateway: a Messages request body in, an answer's bytes out.

Shared by the server's route (``api.routes_gateway``) and a sandboxed harness's socket
(``agent.gateway.unix_socket``), as ``wire`` is for OpenAI's. Refusals keep the
status ``wire.ERRORS`` gives their kind and take Anthropic's error types: 400 ``invalid_request_error`` (the
message starts with the field at fault; a prompt past the context limit is
``prompt is too long: ...``, the words Anthropic's clients look for), 401
``authentication_error``, 404 ``not_found_error``, 408 ``timeout_error``, 502
``api_error``. ``POST /v1/messages/count_tokens`` (``parse_count_request``,
``count_body``) answers ``{"input_tokens": N}``: the policy tokenizer's exact count of
the request rendered whole by its chat template, tools included.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import TypeVar

from pydantic import ValidationError

from rollserve.agent.gateway.anthropic import CALL_IDS, content_blocks, stop_reason, to_chat_request
from rollserve.agent.gateway.base import BadRequest, ContextLengthExceeded, GatewayRefusal
from rollserve.agent.gateway.messages import Unsupported
from rollserve.agent.gateway.session import GatewayReply
from rollserve.agent.gateway.sliced import validate_sliced
from rollserve.agent.gateway.wire import status
from rollserve.contract.anthropic import (
    AnthropicError,
    AnthropicErrorBody,
    AnthropicUsage,
    CountTokensRequest,
    MessagesRequest,
    MessagesResponse,
    TextOut,
    ToolUseOut,
)
from rollserve.contract.gateway import ChatCompletionRequest
from rollserve.contract.validation import JSONInputError, field_name, parse_json

__all__ = ["CALL_IDS", "count_body", "error_body", "events", "message", "parse_count_request", "parse_request"]

R = TypeVar("R", bound=CountTokensRequest)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 408: "timeout_error"}
# What pydantic puts in an error's location for a union's member: not a field.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})
_UNION_GENERICS = ("list[", "dict[")


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def error_body(refusal: GatewayRefusal) -> bytes:
    """``refusal`` in Anthropic's error shape."""
    message = refusal.message
    if isinstance(refusal, ContextLengthExceeded):
        message = f"prompt is too long: {message}"
    kind = ERROR_TYPES.get(status(refusal), "api_error")
    return _json(AnthropicErrorBody(error=AnthropicError(type=kind, message=message)).model_dump(mode="json"))


def _refusal(param: str, message: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param)


def parse_request(raw: bytes) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """The request in ``raw`` and the chat request the session renders; a
    ``BadRequest`` (the message starting with the field) when it is not JSON
    rollserve can hold, not a Messages request, or holds what cannot be rendered."""
    return _parse(MessagesRequest, raw)


def parse_count_request(raw: bytes) -> tuple[CountTokensRequest, ChatCompletionRequest]:
    """As ``parse_request``, for ``/v1/messages/count_tokens`` (no ``max_tokens``)."""
    return _parse(CountTokensRequest, raw)


def count_body(tokens: int) -> bytes:
    """The answer of ``/v1/messages/count_tokens``."""
    return _json({"input_tokens": tokens})


def _parse(kind: type[R], raw: bytes) -> tuple[R, ChatCompletionRequest]:
    try:
        value = parse_json(raw)
    except JSONInputError as exc:
        raise _refusal(field_name(exc.loc), exc.message) from None
    try:
        request = validate_sliced(kind, value)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [
            p for p in first["loc"] if not (isinstance(p, str) and (p in _UNION_TAGS or p.startswith(_UNION_GENERICS)))
        ]
        raise _refusal(field_name(loc), first["msg"]) from None
    try:
        return request, to_chat_request(request)
    except Unsupported as exc:
        raise _refusal(exc.param, exc.message) from None


def _usage(answer: GatewayReply) -> AnthropicUsage:
    return AnthropicUsage(input_tokens=answer.prompt_tokens, output_tokens=answer.completion_tokens)


def message(answer: GatewayReply, model: str) -> MessagesResponse:
    """The answer as a Messages response."""
    return MessagesResponse(
        id=f"msg_{uuid.uuid4().hex}",
        model=model,
        content=content_blocks(answer.reply),
        stop_reason=stop_reason(answer.finish_reason),
        usage=_usage(answer),
    )


def _event(kind: str, payload: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + _json({"type": kind, **payload}) + b"\n\n"


def events(answer: GatewayReply, model: str) -> Iterator[bytes]:
    """The answer as Anthropic streams it (server-sent events): ``message_start`` (no
    content yet), each block as ``content_block_start``, one ``content_block_delta``
    (``text_delta``, or ``input_json_delta`` with the whole input) and
    ``content_block_stop``, then ``message_delta`` (the stop reason and usage) and
    ``message_stop``."""
    whole = message(answer, model)
    start = whole.model_copy(
        update={
            "content": [],
            "stop_reason": None,
            "usage": AnthropicUsage(input_tokens=answer.prompt_tokens, output_tokens=0),
        }
    )
    yield _event("message_start", {"message": start.model_dump(mode="json")})
    for index, block in enumerate(whole.content):
        if isinstance(block, TextOut):
            opened: TextOut | ToolUseOut = TextOut(text="")
            delta: dict[str, object] = {"type": "text_delta", "text": block.text}
        else:
            opened = block.model_copy(update={"input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.input, ensure_ascii=False)}
        yield _event("content_block_start", {"index": index, "content_block": opened.model_dump(mode="json")})
        yield _event("content_block_delta", {"index": index, "delta": delta})
        yield _event("content_block_stop", {"index": index})
    yield _event(
        "message_delta",
        {
            "delta": {"stop_reason": whole.stop_reason, "stop_sequence": None},
            "usage": whole.usage.model_dump(mode="json"),
        },
    )
    yield _event("message_stop", {})

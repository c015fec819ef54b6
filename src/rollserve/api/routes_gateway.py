"""The recording gateway's routes: OpenAI Chat Completions for an unmodified harness.

A harness sets ``OPENAI_BASE_URL=<server>/v1/gateway/<key>/v1`` (any API key: the key
in the path is what names the session, and these paths need no ``--api-token``) and
calls ``POST .../chat/completions`` as it would call OpenAI, with ``stream`` true or
not; ``POST /v1/gateway/<key>/end`` says it is done. Refusals are OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``): 400 for a bad request (``param``
names the field) or a prompt past the context limit (``context_length_exceeded``), 401
for an unknown key, 404 for a session that has ended, 408 at the time limit, 502 when
the backend failed. The trainer reads a rollout's key from
``GET /v1/rollouts/{id}/gateway`` (behind the API token like every trainer route).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from rollserve.api.errors import errors, model_response, render_json
from rollserve.contract import MAX_WAIT
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
    GatewayInfo,
    ToolCallDelta,
    Usage,
)
from rollserve.contract.validation import JSONInputError, field_name, parse_json
from rollserve.engine.gateway import GatewayRefusal, GatewayReply, Gateways

PREFIX = "/v1/gateway/"  # the harness's paths: no API token (the key is the credential)
_THREAD_PARSE_BYTES = 256 * 1024

router = APIRouter(tags=["gateway"])


def _gateways(request: Request) -> Gateways:
    gateways: Gateways = request.app.state.service.gateways
    return gateways


def _error(status: int, message: str, type_: str = "invalid_request_error",
           param: str | None = None, code: str | None = None) -> Response:
    body = GatewayErrorBody(error=GatewayError(message=message, type=type_, param=param,
                                               code=code))
    return Response(render_json(body.model_dump()), status_code=status,
                    media_type="application/json")


def _refused(refusal: GatewayRefusal) -> Response:
    return _error(refusal.status, refusal.message, refusal.type, refusal.param, refusal.code)


async def _parse(request: Request) -> ChatCompletionRequest | Response:
    raw = await request.body()
    try:
        value = (await asyncio.to_thread(parse_json, raw) if len(raw) > _THREAD_PARSE_BYTES
                 else parse_json(raw))
    except JSONInputError as exc:
        return _error(400, exc.message, param=field_name(exc.loc))
    try:
        return ChatCompletionRequest.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = field_name(first["loc"])
        return _error(400, f"{param}: {first['msg']}", param=param)


# The harness's routes are OpenAI's API (OpenAI documents them; their errors are
# OpenAI's shape, not rollserve's ErrorBody), so /openapi.json leaves them out.
@router.post("/v1/gateway/{key}/v1/chat/completions", include_in_schema=False)
async def chat_completions(key: str, request: Request) -> Response:
    """One model call of the harness (OpenAI Chat Completions; ``stream: true`` answers
    ``chat.completion.chunk`` server-sent events, then ``data: [DONE]``)."""
    parsed = await _parse(request)
    if isinstance(parsed, Response):
        return parsed
    try:
        answer = await _gateways(request).complete(key, parsed)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    usage = Usage(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                  total_tokens=answer.prompt_tokens + answer.completion_tokens)
    if parsed.stream:
        include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
        chunks = _chunks(answer, completion_id, created, parsed.model, usage if include_usage else None)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    message = AssistantMessage(content=answer.reply.content,
                               tool_calls=answer.reply.tool_calls or None)
    completion = ChatCompletion(id=completion_id, created=created, model=parsed.model,
                                choices=[Choice(message=message,
                                                finish_reason=answer.finish_reason)],
                                usage=usage)
    return await model_response(completion)


async def _chunks(answer: GatewayReply, completion_id: str, created: int, model: str,
                  usage: Usage | None) -> AsyncIterator[bytes]:
    """The reply as OpenAI streams it: the role, the content, each tool call, the finish
    reason, the usage when asked for, then ``[DONE]``."""
    def chunk(delta: Delta | None, finish: ChunkChoice | None = None,
              with_usage: Usage | None = None) -> bytes:
        choices = [finish] if finish is not None else (
            [ChunkChoice(delta=delta)] if delta is not None else [])
        body = ChatCompletionChunk(id=completion_id, created=created, model=model,
                                   choices=choices, usage=with_usage)
        return b"data: " + render_json(body.model_dump(exclude_none=True)) + b"\n\n"

    yield chunk(Delta(role="assistant", content=""))
    if answer.reply.content:
        yield chunk(Delta(content=answer.reply.content))
    for index, call in enumerate(answer.reply.tool_calls):
        yield chunk(Delta(tool_calls=[ToolCallDelta(
            index=index, id=call.id, type="function",
            function=FunctionCall(name=call.function.name, arguments=call.function.arguments))]))
    yield chunk(None, ChunkChoice(delta=Delta(), finish_reason=answer.finish_reason))
    if usage is not None:
        yield chunk(None, None, usage)
    yield b"data: [DONE]\n\n"


class Ended(BaseModel):
    """The harness's session has ended."""

    ended: bool


@router.post("/v1/gateway/{key}/end", include_in_schema=False)
async def end(key: str, request: Request) -> Response:
    """The harness is done: the rollout's RUN ends and its EVAL grades the episode."""
    try:
        _gateways(request).end(key)
    except GatewayRefusal as refusal:
        return _refused(refusal)
    return await model_response(Ended(ended=True))


@router.get("/v1/rollouts/{rollout_id}/gateway", response_model=GatewayInfo,
            tags=["rollouts"], responses=errors(404))
async def gateway_info(rollout_id: str, request: Request,
                       wait: float = Query(0.0, ge=0.0, le=MAX_WAIT, description=(
                           "seconds to wait for the rollout's RUN to open its session"))
                       ) -> Response:
    """The rollout's gateway key and the base URL its harness uses (404 until its RUN
    opens the session, and after it ends)."""
    return await model_response(await _gateways(request).info(rollout_id, wait))

"""The Responses wire for the gateway: a ``/responses`` request body in, an answer's bytes out.

Shared by the server's route (``api.routes_gateway``) and a sandboxed harness's socket
(``agent.gateway.unix_socket``), as ``wire`` is for Chat Completions. Refusals are
OpenAI's error shape with the status ``wire.ERRORS`` gives their kind (a 400's
``param`` names the field: ``input[3].content[0]``, ``tools[9].type``).

A streamed answer is the event sequence OpenAI sends (each event with its
``sequence_number``): ``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, then for a message ``response.content_part.added``,
``response.output_text.delta`` (the whole text), ``response.output_text.done``,
``response.content_part.done``, or for a call ``response.function_call_arguments.delta``
and ``.done``; ``response.output_item.done``; last ``response.completed`` with the
usage (``response.incomplete`` when the sample was cut at the token limit).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

from pydantic import ValidationError

from rollserve.agent.gateway.base import POLICY_MODEL, BadRequest
from rollserve.agent.gateway.messages import Unsupported
from rollserve.agent.gateway.responses import CALL_IDS, output_items, to_chat_request
from rollserve.agent.gateway.session import GatewayReply
from rollserve.agent.gateway.sliced import validate_sliced
from rollserve.contract.gateway import ChatCompletionRequest
from rollserve.contract.responses import (
    FunctionCallItem,
    IncompleteDetails,
    ModelEntry,
    ModelList,
    OutputMessage,
    Response,
    ResponsesRequest,
    ResponsesUsage,
)
from rollserve.contract.validation import JSONInputError, field_name, parse_json

__all__ = ["CALL_IDS", "events", "models", "parse_request", "response"]

# What pydantic puts in an error's location for a union's member: not a field.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})
_UNION_GENERICS = ("list[", "dict[")


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _refusal(param: str, message: str) -> BadRequest:
    return BadRequest(f"{param}: {message}", param=param)


def _at_fault(exc: ValidationError) -> tuple[str, str]:
    """The field at fault and why: of the first error's field, the deepest error (``input``
    is a string or a list of items: a bad item's field is named, not the string the
    input is not)."""
    errors = exc.errors()
    field = errors[0]["loc"][:1]
    locs = [
        (
            [p for p in e["loc"] if not (isinstance(p, str) and (p in _UNION_TAGS or p.startswith(_UNION_GENERICS)))],
            e["msg"],
        )
        for e in errors
        if e["loc"][:1] == field
    ]
    loc, message = max(locs, key=lambda found: len(found[0]))
    return field_name(loc), message


def parse_request(raw: bytes) -> tuple[ResponsesRequest, ChatCompletionRequest]:
    """The request in ``raw`` and the chat request the session renders; a
    ``BadRequest`` (``param`` naming the field) when it is not JSON rollserve can
    hold, not a Responses request, or holds what cannot be rendered."""
    try:
        value = parse_json(raw)
    except JSONInputError as exc:
        raise _refusal(field_name(exc.loc), exc.message) from None
    try:
        request = validate_sliced(ResponsesRequest, value, "input")
    except ValidationError as exc:
        param, message = _at_fault(exc)
        raise _refusal(param, message) from None
    try:
        return request, to_chat_request(request)
    except Unsupported as exc:
        raise _refusal(exc.param, exc.message) from None


def response(answer: GatewayReply, request: ResponsesRequest) -> Response:
    """The answer as a Responses ``response``."""
    cut = answer.finish_reason == "length"
    items = output_items(answer.reply)
    if cut:
        items = [item.model_copy(update={"status": "incomplete"}) for item in items]
    return Response(
        id=f"resp_{uuid.uuid4().hex}",
        created_at=int(time.time()),
        status="incomplete" if cut else "completed",
        model=request.model,
        output=items,
        usage=ResponsesUsage(
            input_tokens=answer.prompt_tokens,
            output_tokens=answer.completion_tokens,
            total_tokens=answer.prompt_tokens + answer.completion_tokens,
        ),
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if cut else None,
        instructions=request.instructions,
        tools=[t.model_dump(exclude_none=True) for t in request.tools or []],
        tool_choice=request.tool_choice,
        parallel_tool_calls=request.parallel_tool_calls is not False,
    )


def _item_events(index: int, item: OutputMessage | FunctionCallItem) -> Iterator[tuple[str, dict]]:
    """One output item's events, from ``output_item.added`` to ``output_item.done``."""
    at: dict[str, object] = {"item_id": item.id, "output_index": index}
    if isinstance(item, OutputMessage):
        opened = item.model_copy(update={"status": "in_progress", "content": []})
        yield "response.output_item.added", {"output_index": index, "item": opened.model_dump(mode="json")}
        for part_index, part in enumerate(item.content):
            empty = part.model_copy(update={"text": ""}).model_dump(mode="json")
            whole = part.model_dump(mode="json")
            spot = {**at, "content_index": part_index}
            yield "response.content_part.added", {**spot, "part": empty}
            yield "response.output_text.delta", {**spot, "delta": part.text, "logprobs": []}
            yield "response.output_text.done", {**spot, "text": part.text, "logprobs": []}
            yield "response.content_part.done", {**spot, "part": whole}
    else:
        opened_call = item.model_copy(update={"status": "in_progress", "arguments": ""})
        yield "response.output_item.added", {"output_index": index, "item": opened_call.model_dump(mode="json")}
        yield "response.function_call_arguments.delta", {**at, "delta": item.arguments}
        yield "response.function_call_arguments.done", {**at, "name": item.name, "arguments": item.arguments}
    yield "response.output_item.done", {"output_index": index, "item": item.model_dump(mode="json")}


def events(answer: GatewayReply, request: ResponsesRequest) -> Iterator[bytes]:
    """The answer as OpenAI streams it (see the module's docstring)."""
    whole = response(answer, request)
    start = whole.model_copy(
        update={"status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    ).model_dump(mode="json")

    def sequence() -> Iterator[tuple[str, dict]]:
        yield "response.created", {"response": start}
        yield "response.in_progress", {"response": start}
        for index, item in enumerate(whole.output):
            yield from _item_events(index, item)
        last = "response.incomplete" if whole.status == "incomplete" else "response.completed"
        yield last, {"response": whole.model_dump(mode="json")}

    for number, (kind, payload) in enumerate(sequence()):
        yield (
            f"event: {kind}\ndata: ".encode() + _json({"type": kind, **payload, "sequence_number": number}) + b"\n\n"
        )


def models() -> ModelList:
    """``GET /models``: the one model name the gateway lists."""
    return ModelList(data=[ModelEntry(id=POLICY_MODEL)])

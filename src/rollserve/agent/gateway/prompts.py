"""What the gateway's session makes of one call, apart from its state: the request's
messages for the template and as compared (``convert``), a whole render under the
context limit (``whole``: an auxiliary call's prompt, a token count), a standalone
call as a turn (``standalone_turn``), the finish reason, and the refusals' wording."""

from __future__ import annotations

import json
from typing import Literal

from jinja2 import TemplateError

from rollserve.agent.base import ToolCallRecord
from rollserve.agent.gateway.base import BadRequest, ContextLengthExceeded
from rollserve.agent.gateway.messages import (
    Normal,
    Reply,
    normalized,
    template_tools,
    to_template,
)
from rollserve.agent.tool_calls import ToolPresentation
from rollserve.agent.trajectory import Turn
from rollserve.contract.gateway import ChatCompletionRequest, ToolDefinition
from rollserve.llm.base import Generation, Message, PromptBuilder, PromptOverBudget, Tokenizer

__all__ = [
    "TEMPLATE_ERRORS",
    "FinishReason",
    "convert",
    "finish_reason",
    "record_call",
    "standalone_turn",
    "too_long",
    "unrenderable",
    "whole",
]

FinishReason = Literal["stop", "length", "tool_calls"]
# What a chat template raises on messages it cannot render (roles out of order...).
TEMPLATE_ERRORS = (TemplateError, TypeError, ValueError, KeyError, IndexError, RecursionError)


def finish_reason(reply: Reply, gen: Generation) -> FinishReason:
    return "tool_calls" if reply.tool_calls else "length" if gen.finish_reason == "length" else "stop"


def too_long(limit: int, size: str) -> str:
    return (
        f"This model's maximum context length is {limit} tokens; the messages take {size}, leaving no room to sample."
    )


def unrenderable(exc: BaseException) -> BadRequest:
    # The chat template refused these messages (roles out of order, a field it cannot
    # render...): the harness's request, not the server, is at fault.
    return BadRequest(
        f"the policy's chat template cannot render these messages: {type(exc).__name__}: {exc}", param="messages"
    )


async def whole(
    tokenizer: Tokenizer, template: list[Message], shown: ToolPresentation | None, limit: int
) -> tuple[PromptBuilder, list[int]]:
    """A fresh builder and its full render of ``template``: ``ContextLengthExceeded``
    when it leaves no room to sample under ``limit`` (proven from its bytes before it
    is tokenized, or counted), ``BadRequest`` when the template refuses it; a
    tokenizer's ``RolloutError`` is the caller's to handle."""
    builder = tokenizer.prompt_builder(tools=template_tools(shown))
    builder.max_prompt_tokens = limit - 1
    try:
        prompt = await builder.afirst(template)
    except PromptOverBudget as over:
        raise ContextLengthExceeded(too_long(limit, str(over))) from None
    except TEMPLATE_ERRORS as exc:
        raise unrenderable(exc) from None
    if len(prompt) >= limit:
        raise ContextLengthExceeded(too_long(limit, f"{len(prompt)} tokens"))
    return builder, prompt


def standalone_turn(prompt: list[int], gen: Generation, version: int | None, reply: Reply) -> Turn:
    """A call rendered whole (an auxiliary call) as a turn of a sequence of its own."""
    return Turn(
        prompt_ids_delta=list(prompt),
        output_ids=list(gen.output_ids),
        logprobs=list(gen.logprobs),
        finish_reason=gen.finish_reason,
        backend=gen.backend,
        policy_version=version,
        tool_calls=[record_call(c.function.name, c.function.arguments, c.id) for c in reply.tool_calls],
    )


def convert(request: ChatCompletionRequest, shown: ToolPresentation | None) -> tuple[list[Message], list[Normal], str]:
    """The request's messages for the template, as compared, and its tools' key."""
    template = to_template(request.messages, shown)
    normal = [normalized(m, i) for i, m in enumerate(request.messages)]
    return template, normal, _tools_key(request.tools)


def _tools_key(tools: list[ToolDefinition] | None) -> str:
    return json.dumps([t.model_dump(exclude_none=True) for t in tools or []], sort_keys=True)


def record_call(name: str, arguments: str, call_id: str) -> ToolCallRecord:
    decoded = json.loads(arguments)
    return {"name": name, "arguments": decoded if isinstance(decoded, dict) else arguments, "id": call_id}

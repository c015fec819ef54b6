"""The gateway's Anthropic wire: the Messages API as an unmodified agent harness speaks it.

A harness whose ``ANTHROPIC_BASE_URL`` is ``<server>/v1/gateway/<key>`` posts a
``MessagesRequest`` to ``/v1/messages`` and gets a ``MessagesResponse`` (or, with
``stream: true``, Anthropic's server-sent events: ``message_start``,
``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` per block,
``message_delta``, ``message_stop``). A refusal is an ``AnthropicErrorBody``:
``{"type": "error", "error": {"type", "message"}}``.

A content block is read loosely here (``type`` and the fields of the block types
rollserve renders: ``text``, ``tool_use``, ``tool_result``) so that a block rollserve
cannot render is refused by ``agent.gateway.anthropic`` naming it exactly
(``messages[2].content[0]``), not by a union's error. Sampling settings
(``temperature``, ``top_p``, ``top_k``, ``stop_sequences``) are checked for their type
and not acted on: the policy samples with the trainer's sampling parameters;
``max_tokens`` (required, as Anthropic requires it) can only lower the trainer's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rollserve.contract.requests import JSONObject

StopReason = Literal["end_turn", "max_tokens", "tool_use"]


class Block(BaseModel):
    """One content block as a harness sends it; which fields a type needs is checked
    when it is rendered."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: JsonValue = None  # tool_use: an object
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None  # tool_result
    is_error: bool | None = None  # tool_result (accepted; the template has no place for it)


class AnthropicMessage(BaseModel):
    """A message of ``messages``: the system prompt is the request's ``system``."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(BaseModel):
    """A tool the harness defines (``type`` absent or ``custom``); Anthropic's own
    server-side tools (``bash_20250124``...) have no schema to render and are refused."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: JSONObject | None = None
    type: str | None = None


class MessagesRequest(BaseModel):
    """What a harness posts to ``/v1/messages``."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    max_tokens: int = Field(ge=1, description="required; can only lower the trainer's max_tokens")
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[AnthropicTool] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(description="toolu_...: the tool_result answering it names it")
    name: str
    input: JSONObject


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class MessagesResponse(BaseModel):
    """The answer (``"type": "message"``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextOut | ToolUseOut]
    stop_reason: StopReason | None
    stop_sequence: None = None
    usage: AnthropicUsage


class AnthropicError(BaseModel):
    type: str = Field(description="invalid_request_error | authentication_error | "
                                  "not_found_error | timeout_error | api_error")
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error shape."""

    type: Literal["error"] = "error"
    error: AnthropicError

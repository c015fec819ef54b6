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

What Claude Code sends is taken (found by running it: docs/harnesses.md): a ``system``
message in ``messages`` (its ``mid-conversation-system`` beta: rendered as a system
message where it stands), ``thinking`` (``enabled`` / ``adaptive`` / ``disabled``:
accepted and not acted on; the policy thinks as its template and sampling let it,
and a reply never has thinking blocks), ``context_management`` edits that clear
thinking (there is none to clear), ``output_config`` (``effort``; ``format``, the
schema Claude Code's title call asks for: nothing holds the policy to it, it samples
freely), ``metadata``, ``tool_choice`` ``auto``, ``cache_control`` on any block
(ignored). What cannot be honoured is refused naming the field: thinking blocks,
images and documents, server tools, assistant prefill, ``tool_choice`` other than
``auto``, other ``context_management`` edits (they rewrite the history on the
server), ``mcp_servers`` and ``container``.
``CountTokensRequest`` is the same request without ``max_tokens``
(``POST /v1/messages/count_tokens``).
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

    role: Literal["user", "assistant", "system"]  # system: mid-conversation (a beta)
    content: str | list[Block]


class AnthropicTool(BaseModel):
    """A tool the harness defines (``type`` absent or ``custom``); Anthropic's own
    server-side tools (``bash_20250124``...) have no schema to render and are refused."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: JSONObject | None = None
    type: str | None = None


class ThinkingConfig(BaseModel):
    """``thinking``: accepted, not acted on (the policy samples as the trainer says)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class ToolChoice(BaseModel):
    """``tool_choice``: only ``auto`` can be honoured (nothing forces the policy)."""

    model_config = ConfigDict(extra="allow")

    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ContextEdit(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class ContextManagement(BaseModel):
    """``context_management``: only edits that clear thinking blocks (none are ever
    sent back: a reply has none) are taken."""

    model_config = ConfigDict(extra="allow")

    edits: list[ContextEdit] = Field(default_factory=list)


class OutputConfig(BaseModel):
    """``output_config``: taken, not acted on (nothing holds the policy to a ``format``)."""

    model_config = ConfigDict(extra="allow")

    effort: str | None = None
    format: JSONObject | None = None


class CountTokensRequest(BaseModel):
    """What a harness posts to ``/v1/messages/count_tokens``: a Messages request
    without ``max_tokens``."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[AnthropicTool] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    thinking: ThinkingConfig | None = None
    tool_choice: ToolChoice | None = None
    metadata: JSONObject | None = None
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """What a harness posts to ``/v1/messages``."""

    max_tokens: int = Field(ge=1, description="required; can only lower the trainer's max_tokens")


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
    type: str = Field(
        description="invalid_request_error | authentication_error | not_found_error | timeout_error | api_error"
    )
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error shape."""

    type: Literal["error"] = "error"
    error: AnthropicError

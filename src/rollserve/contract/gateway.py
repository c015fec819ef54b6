"""The gateway's wire: OpenAI Chat Completions as an unmodified agent harness speaks it.

A harness whose ``OPENAI_BASE_URL`` is ``<server>/v1/gateway/<key>/v1`` posts
``ChatCompletionRequest`` to ``/chat/completions`` and gets a ``ChatCompletion`` (or,
with ``stream: true``, ``ChatCompletionChunk`` server-sent events), in OpenAI's
shapes. Fields a harness sends that rollserve does not act on (``temperature``,
``top_p``, ``stop``, ``store``, ``parallel_tool_calls``...) are accepted and ignored:
the policy samples with the trainer's sampling parameters, so its logprobs are the
ones the trainer expects. Three fields would change WHAT is sampled, which the
gateway cannot honour without changing the policy's distribution, so any value but the
unconstrained one is refused (400 naming the field) rather than silently not honoured:
``tool_choice`` (``auto``, or ``none`` with no tools: never ``required``, ``none``
with tools, or a named function), ``response_format`` (``text`` only: no JSON mode
or schema) and ``reasoning_effort`` (absent: how the policy reasons is its chat
template's and the trainer's choice). A refusal is a ``GatewayErrorBody``, OpenAI's
error shape.

``GatewayInfo`` is what the trainer's API says about a rollout's gateway session.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationInfo, field_validator

from rollserve.contract.requests import JSONObject


class FunctionCall(BaseModel):
    name: str = Field(description="the function called")
    arguments: str = Field(description="its arguments, a JSON string")


class ChatToolCall(BaseModel):
    """A tool call of an assistant message (OpenAI's ``tool_calls`` entry)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="the call's id, which the tool message answering it names")
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts are rendered."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class GatewayMessage(BaseModel):
    """A chat message as a harness sends it. Keys rollserve does not read (``refusal``,
    ``annotations``...) are allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: JSONObject | None = None


class ToolDefinition(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """What a harness posts. Sampling settings other than a lower ``max_tokens`` are
    ignored (the trainer's apply); ``n`` must be 1."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[GatewayMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: Literal[1] = 1
    tool_choice: str | JSONObject | None = Field(
        None, description="auto (or none when no tools are offered): the policy chooses"
    )
    response_format: JSONObject | None = Field(None, description='{"type": "text"} only')
    reasoning_effort: JsonValue = Field(None, description="not served: absent or null only")

    @field_validator("tool_choice")
    @classmethod
    def _unconstrained_choice(cls, choice: str | JSONObject | None, info: ValidationInfo) -> str | JSONObject | None:
        if choice is None or choice == "auto" or (choice == "none" and not info.data.get("tools")):
            return choice
        raise ValueError(
            f"{choice!r} is not served: the policy samples unconstrained and its "
            "tool calls are parsed from its text, so only 'auto' (or 'none' "
            "without tools) can be honoured"
        )

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, value: JSONObject | None) -> JSONObject | None:
        if value is None or value.get("type") == "text":
            return value
        raise ValueError(
            f"{value.get('type')!r} is not served: only 'text' (the gateway "
            "cannot constrain what the policy samples to JSON or a schema)"
        )

    @field_validator("reasoning_effort")
    @classmethod
    def _no_effort(cls, value: JsonValue) -> None:
        if value is None:
            return None
        raise ValueError(
            f"{value!r} is not served: how the policy reasons is its chat "
            "template's and the trainer's sampling's; send no reasoning_effort"
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ChatToolCall] | None = None
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class GatewayError(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error | authentication_error | server_error ...")
    param: str | None = Field(None, description="the request field at fault")
    code: str | None = None


class GatewayErrorBody(BaseModel):
    """OpenAI's error shape."""

    error: GatewayError


class GatewayInfo(BaseModel):
    """A rollout's gateway session, for the trainer (``GET /v1/rollouts/{id}/gateway``)."""

    rollout_id: str = Field(description="the rollout the session records")
    key: str = Field(description="the session's key: a secret, valid while the rollout runs")
    base_url: str = Field(description="the path a harness uses as OPENAI_BASE_URL (after the server's address)")
    ended: bool = Field(description="true once the session took its last call")

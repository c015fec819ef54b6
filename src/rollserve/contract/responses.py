"""The gateway's Responses wire: the OpenAI Responses API as an unmodified harness speaks it.

A harness whose ``OPENAI_BASE_URL`` is ``<server>/v1/gateway/<key>/v1`` posts a
``ResponsesRequest`` to ``/responses`` and gets a ``Response`` (or, with
``stream: true``, the Responses server-sent events, ``response.created`` to
``response.completed``). A refusal is OpenAI's error shape (``GatewayErrorBody``).

An input item is read loosely here (``type`` and the fields of the item types
rollserve renders: ``message``, ``function_call``, ``function_call_output``,
``reasoning``) so that one rollserve cannot render is refused by
``agent.gateway.responses`` naming it exactly (``input[3].type``), not by a union's
error. Settings that would change what is sampled are decided by the Chat wire's one
validator (``contract.gateway``), the request mapped into a chat request first:
``tool_choice`` (``auto``, or ``none`` without tools), ``text.format`` (as
``response_format``: ``text`` only) and ``reasoning.effort`` (as ``reasoning_effort``:
none); any other value is a 400 naming the Responses field. Settings that do not
change what is sampled or recorded (``reasoning.summary``, ``include``, ``store``,
``parallel_tool_calls``, ``text.verbosity``, ``metadata``, ``prompt_cache_key``...)
are accepted and ignored, as the Chat wire ignores ``temperature``: the policy samples
with the trainer's sampling parameters; ``max_output_tokens`` can only lower the
trainer's ``max_tokens``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rollserve.contract.requests import JSONObject


class InputPart(BaseModel):
    """One part of an input message's content; only text parts are rendered."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class InputItem(BaseModel):
    """One item of ``input`` (a message may leave out ``type``); which fields a type
    needs is checked when it is rendered."""

    model_config = ConfigDict(extra="allow")

    type: str | None = None
    role: str | None = None  # message
    content: str | list[InputPart] | None = None  # message
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call: a JSON string
    output: str | list[InputPart] | None = None  # function_call_output


class ResponsesTool(BaseModel):
    """A tool the harness offers: only ``function`` tools are rendered; OpenAI's
    built-in tools (``web_search``, ``file_search``, ``custom``...) are refused."""

    model_config = ConfigDict(extra="allow")

    type: str
    name: str | None = None
    description: str | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class ResponsesRequest(BaseModel):
    """What a harness posts to ``/responses``."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: str | None = Field(
        None, description=("refused: the gateway stores no responses, the harness sends the whole input")
    )
    tool_choice: JsonValue = "auto"
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[JSONObject] = Field(default_factory=list)
    logprobs: list[JSONObject] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The reply's text."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    """One of the reply's tool calls; the ``function_call_output`` answering it names
    its ``call_id``."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = Field(description="a JSON string")
    status: Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponsesUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class Response(BaseModel):
    """The answer (``"object": "response"``); ``status`` ``incomplete`` when the
    sample was cut at the token limit."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputMessage | FunctionCallItem]
    usage: ResponsesUsage | None
    incomplete_details: IncompleteDetails | None = None
    error: None = None
    instructions: str | None = None
    tools: list[JSONObject] = Field(default_factory=list)
    tool_choice: JsonValue = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    store: bool = False


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "rollserve"


class ModelList(BaseModel):
    """``GET /models``: the model the gateway answers as (any name is accepted)."""

    object: Literal["list"] = "list"
    data: list[ModelEntry]

"""A harness's OpenAI messages as the policy's chat template takes them, and a
sampled reply as the harness takes it.

The template sees the conversation the way rollserve's own agent loop writes it, so
the same policy sees the same tokens whichever side runs the agent: tools through
the template when it renders them, else a tools section in the system prompt
(``agent.tool_calls.present_tools``); an assistant message's tool calls written in
the policy's format after its text; tool results as ``tool`` messages (in
``<tool_response>`` when the template does not wrap them).

``normalized`` is what decides that a call continues the conversation so far: the
fields a template renders, with the equivalent spellings of one message made equal
(content ``None`` and ``""``, a string and one text part, arguments as a JSON string
with any spacing).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from rollserve.agent.tool_calls import (
    MalformedCall,
    ToolPresentation,
    format_tool_call,
    parse_tool_calls,
    present_tools,
    tool_message,
)
from rollserve.contract.gateway import (
    ChatCompletionRequest,
    ChatToolCall,
    FunctionCall,
    GatewayMessage,
    ToolDefinition,
)
from rollserve.llm.base import Message, Tokenizer, ToolSchema

__all__ = [
    "TEXT_SEPARATOR",
    "Reply",
    "Unsupported",
    "chat_request",
    "joined_texts",
    "normalized",
    "parse_reply",
    "presentation",
    "to_template",
]

Normal = tuple[str, str, str | None, str | None, tuple[tuple[str, str, str], ...]]


class Unsupported(ValueError):
    """A message rollserve cannot render; ``param`` names it (``messages[2].content``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def chat_request(params: dict[str, str], **fields: object) -> ChatCompletionRequest:
    """The chat request another wire's request becomes, checked by the one validator
    of ``contract.gateway`` (what changes what is sampled: ``tool_choice``,
    ``response_format``, ``reasoning_effort``); its refusal is ``Unsupported`` naming
    the wire's own field (``params``: chat field -> that wire's name)."""
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "(request)"
        message = error["msg"].removeprefix("Value error, ")
        raise Unsupported(params.get(field, field), message) from None


PartT = TypeVar("PartT")
# Between the text parts (blocks) of one message, on the Responses and Anthropic wires.
TEXT_SEPARATOR = "\n\n"


def joined_texts(
    content: str | Sequence[PartT] | None, where: str, text: Callable[[PartT, str], str | None], refusal: str
) -> str:
    """The text of a message's ``content`` on the Responses and Anthropic wires: its
    string, or its text parts (``text(part, where)``: the part's text, None for a part
    of another type) joined with a blank line; another part is ``Unsupported`` at
    ``where[i]``, ``refusal`` then its type."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for index, part in enumerate(content):
        found = text(part, f"{where}[{index}]")
        if found is None:
            raise Unsupported(f"{where}[{index}]", f"{refusal}{getattr(part, 'type', None)!r}")
        texts.append(found)
    return TEXT_SEPARATOR.join(texts)


def text_of(message: GatewayMessage, index: int) -> str:
    """The message's text: its string, or its text parts joined."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part_index, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise Unsupported(
                f"messages[{index}].content[{part_index}]", f"only text parts are supported, not {part.type!r}"
            )
        texts.append(part.text)
    return "".join(texts)


def _arguments(call: ChatToolCall) -> object:
    """A call's arguments decoded (the raw string when it is not JSON, or nested too
    deep for ``json`` to decode or write back)."""
    try:
        decoded: object = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
        _canonical(decoded)
    except (ValueError, RecursionError):
        return call.function.arguments
    return decoded


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def normalized(message: GatewayMessage, index: int) -> Normal:
    """What of ``message`` a template renders, comparable across spellings."""
    role = "system" if message.role == "developer" else message.role
    calls = tuple((c.id, c.function.name, _canonical(_arguments(c))) for c in message.tool_calls or [])
    return (role, text_of(message, index), message.name, message.tool_call_id, calls)


def presentation(tools: list[ToolDefinition] | None, tokenizer: Tokenizer) -> ToolPresentation | None:
    """How the conversation shows ``tools`` to the policy (None: no tools)."""
    if not tools:
        return None
    schemas = [t.function.model_dump(exclude_none=True) for t in tools]
    return present_tools(schemas, "", tokenizer, "auto", "hermes")


def to_template(messages: list[GatewayMessage], shown: ToolPresentation | None) -> list[Message]:
    """``messages`` as the chat template takes them (see the module's docstring); one
    template message per harness message, after a system message of its own when
    the tools need one and the harness sent none."""
    names: dict[str, str] = {}
    out: list[Message] = []
    section = shown.system_prompt if shown is not None else ""
    # Where the tools section goes depends on the first message only, so a system
    # message a later call appends never gets a second copy of it.
    leads = bool(messages) and messages[0].role in ("system", "developer")
    for index, message in enumerate(messages):
        text = text_of(message, index)
        if message.role in ("system", "developer"):
            if section and index == 0:
                text = f"{text}\n\n{section}" if text else section
            out.append({"role": "system", "content": text})
        elif message.role == "user":
            out.append({"role": "user", "content": text})
        elif message.role == "assistant":
            for call in message.tool_calls or []:
                names[call.id] = call.function.name
                arguments = _arguments(call)
                written = (
                    format_tool_call(call.function.name, arguments)
                    if isinstance(arguments, dict)
                    else f"<tool_call>\n{call.function.arguments}\n</tool_call>"
                )
                text = f"{text}\n{written}" if text else written
            out.append({"role": "assistant", "content": text})
        else:
            name = message.name or names.get(message.tool_call_id or "")
            wrap = shown.wrap_responses if shown is not None else False
            out.append(tool_message(text, name, wrap))
    if section and not leads:
        out.insert(0, {"role": "system", "content": section})
    return out


def template_tools(shown: ToolPresentation | None) -> list[ToolSchema] | None:
    return shown.template_tools if shown is not None else None


@dataclass
class Reply:
    """A sampled reply as the harness reads it."""

    content: str | None
    tool_calls: list[ChatToolCall]


def parse_reply(text: str, parse_calls: bool, id_prefix: str = "call_") -> Reply:
    """``text`` (the sampled ids, decoded) as an assistant message. With tools offered,
    Hermes ``<tool_call>`` blocks become ``tool_calls`` (ids ``id_prefix`` and 96 random
    bits) and the text before the first is the content, as vLLM's ``hermes`` parser
    answers; when any block is malformed the whole text is the content and there are
    no calls (vLLM's answer too)."""
    if not parse_calls:
        return Reply(text, [])
    parsed = parse_tool_calls(text, "hermes")
    if not parsed.items or any(isinstance(item, MalformedCall) for item in parsed.items):
        return Reply(text, [])
    try:  # NaN/Infinity (Python's json reads them) are not JSON: such a call is malformed
        arguments = [json.dumps(call.arguments, ensure_ascii=False, allow_nan=False) for call in parsed.calls]
    except (ValueError, RecursionError):
        return Reply(text, [])
    calls = [
        ChatToolCall(id=f"{id_prefix}{secrets.token_hex(12)}", function=FunctionCall(name=call.name, arguments=args))
        for call, args in zip(parsed.calls, arguments, strict=True)
    ]
    content = text[: text.index("<tool_call>")].rstrip()
    return Reply(content or None, calls)


def reply_message(reply: Reply) -> GatewayMessage:
    """The reply as the harness will send it back (for ``normalized``)."""
    return GatewayMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls or None)

"""Anthropic Messages as the gateway's session takes them, and a reply as content blocks.

A ``MessagesRequest`` becomes the chat request the session renders (the same path,
recording and append-only reuse as an OpenAI call):

- ``system`` (a string, or text blocks) is a first ``system`` message, and a
  ``system`` message of ``messages`` (Claude Code's mid-conversation system beta) a
  ``system`` message where it stands;
- a ``user`` message's ``tool_result`` blocks are ``tool`` messages answering their
  ``tool_use_id``, its text blocks a ``user`` message, in the order they come;
- an ``assistant`` message's text blocks are its content and its ``tool_use`` blocks
  its tool calls (the template writes them after the text, in the policy's format);
- ``tools`` (``name``, ``description``, ``input_schema``) are function tools.

Text blocks of one message are joined with a blank line; ``cache_control`` is
ignored. Blocks rollserve cannot render (images, documents, thinking, server tools)
are refused naming the block, and so is a last message from the assistant
(Anthropic's prefill: the policy's reply is sampled whole, as a new turn, so a
continuation cannot be honoured). Settings that cannot be honoured are refused naming
the field: ``tool_choice`` by the Chat wire's one validator (``contract.gateway``: its
``any`` is ``required``, ``tool`` a named function; ``auto``, or ``none`` without
tools, is served); ``refuse_settings``:
``context_management`` edits other than clearing thinking, ``mcp_servers``,
``container``; ``thinking``, ``metadata`` and ``output_config`` (``effort``, and
``format``: a schema the reply is asked to follow; nothing holds the policy to it,
it samples freely) are taken and not acted on: Claude Code sends both on its calls
(``format`` on its title call, an auxiliary one), so refusing them, as the OpenAI
wires refuse ``response_format`` and ``reasoning_effort``, would fail every run.
A reply is a text block (the content, when there is any) and one ``tool_use`` block
per parsed tool call (ids ``toolu_...``, ``input`` the arguments' object); its
``stop_reason`` is ``tool_use``, ``max_tokens`` (the sample was cut) or ``end_turn``.
"""

from __future__ import annotations

import json

from rollserve.agent.gateway.messages import (
    TEXT_SEPARATOR,
    Reply,
    Unsupported,
    chat_request,
    joined_texts,
)
from rollserve.agent.gateway.session import FinishReason
from rollserve.contract.anthropic import (
    AnthropicMessage,
    AnthropicTool,
    Block,
    CountTokensRequest,
    MessagesRequest,
    StopReason,
    TextOut,
    ToolUseOut,
)
from rollserve.contract.gateway import (
    ChatCompletionRequest,
    ChatToolCall,
    FunctionCall,
    FunctionDefinition,
    GatewayMessage,
    ToolDefinition,
)

__all__ = ["CALL_IDS", "content_blocks", "refuse_settings", "stop_reason", "to_chat_request"]

CALL_IDS = "toolu_"  # the prefix of the tool_use ids a reply gets
STOP_REASONS: dict[FinishReason, StopReason] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _texts(blocks: str | list[Block] | None, where: str) -> str:
    """The text of ``blocks`` (a string, or text blocks only)."""
    return joined_texts(blocks, where, _text, "only text blocks are supported here, not ")


def _tool_call(block: Block, where: str) -> ChatToolCall:
    for field in ("id", "name"):
        if not getattr(block, field):
            raise Unsupported(f"{where}.{field}", "a tool_use block needs a non-empty " + field)
    if not isinstance(block.input, dict):
        raise Unsupported(f"{where}.input", "a tool_use block's input must be an object")
    assert block.id is not None and block.name is not None
    return ChatToolCall(
        id=block.id, function=FunctionCall(name=block.name, arguments=json.dumps(block.input, ensure_ascii=False))
    )


def _text(block: Block, where: str) -> str | None:
    """A text block's text (None: another type)."""
    if block.type != "text":
        return None
    if block.text is None:
        raise Unsupported(f"{where}.text", "a text block needs its text")
    return block.text


def _user(message: AnthropicMessage, where: str) -> list[GatewayMessage]:
    if isinstance(message.content, str):
        return [GatewayMessage(role="user", content=message.content)]
    out: list[GatewayMessage] = []
    texts: list[str] = []
    for index, block in enumerate(message.content):
        at = f"{where}.content[{index}]"
        if (text := _text(block, at)) is not None:
            texts.append(text)
        elif block.type == "tool_result":
            if not block.tool_use_id:
                raise Unsupported(f"{at}.tool_use_id", "a tool_result block needs the id of the tool_use it answers")
            if texts:
                out.append(GatewayMessage(role="user", content=TEXT_SEPARATOR.join(texts)))
                texts = []
            out.append(
                GatewayMessage(
                    role="tool", tool_call_id=block.tool_use_id, content=_texts(block.content, f"{at}.content")
                )
            )
        else:
            raise Unsupported(at, f"a user message's blocks may be text or tool_result, not {block.type!r}")
    if texts or not out:
        out.append(GatewayMessage(role="user", content=TEXT_SEPARATOR.join(texts)))
    return out


def _assistant(message: AnthropicMessage, where: str) -> GatewayMessage:
    if isinstance(message.content, str):
        return GatewayMessage(role="assistant", content=message.content)
    texts: list[str] = []
    calls: list[ChatToolCall] = []
    for index, block in enumerate(message.content):
        at = f"{where}.content[{index}]"
        if (text := _text(block, at)) is not None:
            texts.append(text)
        elif block.type == "tool_use":
            calls.append(_tool_call(block, at))
        elif block.type in ("thinking", "redacted_thinking"):
            raise Unsupported(
                at,
                f"{block.type} blocks are not taken: the gateway's replies "
                "never carry them (a policy's reasoning is in its text)",
            )
        else:
            raise Unsupported(at, f"an assistant message's blocks may be text or tool_use, not {block.type!r}")
    return GatewayMessage(
        role="assistant", content=TEXT_SEPARATOR.join(texts) if texts else None, tool_calls=calls or None
    )


def _tool(tool: AnthropicTool, where: str) -> ToolDefinition:
    if tool.type not in (None, "custom"):
        raise Unsupported(
            f"{where}.type",
            f"only the harness's own tools (custom) are supported, not Anthropic's server tool {tool.type!r}",
        )
    if tool.input_schema is None:
        raise Unsupported(f"{where}.input_schema", "a tool needs its input_schema")
    return ToolDefinition(
        function=FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.input_schema)
    )


# Context edits a harness may ask for that change nothing here: replies carry no
# thinking blocks, so there are none to clear.
_NO_OP_EDITS = "clear_thinking_"
_REFUSED_EXTRAS = {
    "mcp_servers": "MCP servers run by the API are not available: the harness's own tools are",
    "container": "code-execution containers are not available: the harness's own tools are",
}


def refuse_settings(request: CountTokensRequest) -> None:
    """``Unsupported`` naming the first setting of ``request`` the gateway cannot honour."""
    if request.context_management is not None:
        for index, edit in enumerate(request.context_management.edits):
            if not edit.type.startswith(_NO_OP_EDITS):
                raise Unsupported(
                    f"context_management.edits[{index}].type",
                    f"{edit.type!r} would rewrite the history on the server; only "
                    "clearing thinking (a no-op here) is taken",
                )
    for field, why in _REFUSED_EXTRAS.items():
        if (request.model_extra or {}).get(field) is not None:
            raise Unsupported(field, why)


def to_chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    """``request`` as the session's chat request (see the module's docstring);
    ``Unsupported`` names what cannot be rendered or honoured."""
    refuse_settings(request)
    messages: list[GatewayMessage] = []
    if request.system is not None:
        messages.append(GatewayMessage(role="system", content=_texts(request.system, "system")))
    for index, message in enumerate(request.messages):
        where = f"messages[{index}]"
        if message.role == "user":
            messages.extend(_user(message, where))
        elif message.role == "system":
            messages.append(GatewayMessage(role="system", content=_texts(message.content, f"{where}.content")))
        else:
            messages.append(_assistant(message, where))
    last = len(request.messages) - 1
    if request.messages[last].role == "assistant":
        raise Unsupported(
            f"messages[{last}].role",
            "the last message must be the user's: "
            "prefilling the assistant's reply is not supported (the policy's "
            "reply is sampled whole, as a new turn)",
        )
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(request.tools or [])]
    max_tokens = request.max_tokens if isinstance(request, MessagesRequest) else None
    return chat_request(
        {"tool_choice": "tool_choice.type"},
        model=request.model,
        messages=messages,
        tools=tools or None,
        stream=request.stream,
        max_tokens=max_tokens,
        tool_choice=_tool_choice(request),
    )


def _tool_choice(request: CountTokensRequest) -> str | dict[str, object] | None:
    """Anthropic's ``tool_choice`` as the chat request's, for its one validator to decide
    (``auto`` and ``none`` without tools are served; ``any`` is ``required``, ``tool``
    a named function: refused)."""
    choice = request.tool_choice
    if choice is None:
        return None
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type


def content_blocks(reply: Reply) -> list[TextOut | ToolUseOut]:
    """The reply as Anthropic's content: its text (when any), then its tool_use blocks."""
    blocks: list[TextOut | ToolUseOut] = []
    if reply.content:
        blocks.append(TextOut(text=reply.content))
    for call in reply.tool_calls:
        arguments = json.loads(call.function.arguments)  # the parser's: always an object
        blocks.append(ToolUseOut(id=call.id, name=call.function.name, input=arguments))
    return blocks


def stop_reason(finish: FinishReason) -> StopReason:
    return STOP_REASONS[finish]

"""OpenAI Responses input as the gateway's session takes it, and a reply as output items.

A ``ResponsesRequest`` becomes the chat request the session renders (the same path,
recording and append-only reuse as a Chat Completions call):

- ``instructions`` is a first ``system`` message; ``input`` as a string is one
  ``user`` message; the leading system messages (``instructions``, then ``system``
  and ``developer`` items: Codex sends two) are joined into one with a blank line,
  as templates that take one system prompt need (Qwen3.6's refuses a second);
- a ``message`` item (``type`` may be left out) keeps its role (``developer`` is
  ``system``); its text parts (``input_text``, ``output_text``, ``text``) are joined
  with a blank line;
- ``function_call`` items are the tool calls of the assistant message they follow
  (one made with no text when none precedes them), as a reply comes back: its
  text, then its calls; ``call_id`` is the call's id;
- a ``function_call_output`` item is a ``tool`` message answering its ``call_id``;
- a ``reasoning`` item carries no text the policy wrote here (the gateway never
  emits one: a policy's thinking is in its text) and is left out of the render;
- ``tools`` of type ``function`` are function tools.

What rollserve cannot render is refused naming it: another item type
(``item_reference``, ``web_search_call``, ``custom_tool_call``...), a part that is not
text (images, files), OpenAI's built-in or custom tools, and ``previous_response_id``
(the gateway stores no responses: the harness sends its whole input, as Codex does
with ``store: false``).

Settings that would change what is sampled are mapped into the chat request and
decided by the Chat wire's one validator (``contract.gateway``): ``tool_choice``
(``auto``, or ``none`` without tools), ``text.format`` (as ``response_format``:
``text`` only) and ``reasoning.effort`` (as ``reasoning_effort``: none); anything
else is a 400 naming the Responses field (``tool_choice``, ``text.format``,
``reasoning.effort``), never accepted and echoed back as if honoured.

A reply is a ``message`` item (its text; always, when it has no tool calls) and one
``function_call`` item per parsed call (``call_id`` ``call_...``, item id ``fc_...``).
"""

from __future__ import annotations

import secrets
from typing import Literal

from rollserve.agent.gateway.messages import (
    TEXT_SEPARATOR,
    Reply,
    Unsupported,
    chat_request,
    joined_texts,
)
from rollserve.contract.gateway import (
    ChatCompletionRequest,
    ChatToolCall,
    FunctionCall,
    FunctionDefinition,
    GatewayMessage,
    ToolDefinition,
)
from rollserve.contract.responses import (
    FunctionCallItem,
    InputItem,
    InputPart,
    OutputMessage,
    OutputText,
    ResponsesRequest,
    ResponsesTool,
)

__all__ = ["CALL_IDS", "output_items", "to_chat_request"]

CALL_IDS = "call_"  # the prefix of a reply's call_ids
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
Role = Literal["system", "user", "assistant"]
ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _text(part: InputPart, where: str) -> str | None:
    """A text part's text (None: another type)."""
    if part.type not in TEXT_PARTS:
        return None
    if part.text is None:
        raise Unsupported(f"{where}.text", "a text part needs its text")
    return part.text


def _texts(content: str | list[InputPart] | None, where: str) -> str:
    return joined_texts(content, where, _text, "only text parts are supported, not ")


def _required(item: InputItem, where: str, *fields: str) -> None:
    for field in fields:
        if getattr(item, field) is None:
            raise Unsupported(f"{where}.{field}", f"a {item.type} item needs its {field}")


def _call(item: InputItem, where: str) -> ChatToolCall:
    _required(item, where, "call_id", "name", "arguments")
    assert item.call_id is not None and item.name is not None and item.arguments is not None
    return ChatToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))


def _message(item: InputItem, where: str) -> GatewayMessage:
    role = ROLES.get(item.role or "")
    if role is None:
        raise Unsupported(
            f"{where}.role", f"a message's role is system, developer, user or assistant, not {item.role!r}"
        )
    return GatewayMessage(role=role, content=_texts(item.content, f"{where}.content"))


def _items(items: list[InputItem]) -> list[GatewayMessage]:
    out: list[GatewayMessage] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(GatewayMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            _required(item, where, "call_id")
            out.append(
                GatewayMessage(role="tool", tool_call_id=item.call_id, content=_texts(item.output, f"{where}.output"))
            )
        elif kind == "reasoning":
            continue
        else:
            raise Unsupported(
                f"{where}.type",
                f"an input item may be a message, function_call, function_call_output or reasoning, not {kind!r}",
            )
    return out


def _tool(tool: ResponsesTool, where: str) -> ToolDefinition:
    if tool.type != "function":
        raise Unsupported(
            f"{where}.type",
            f"only function tools are supported, not {tool.type!r} "
            "(the policy has no built-in tools: turn it off in the "
            "harness)",
        )
    if not tool.name:
        raise Unsupported(f"{where}.name", "a function tool needs a non-empty name")
    return ToolDefinition(
        function=FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.parameters)
    )


def _one_system(messages: list[GatewayMessage]) -> list[GatewayMessage]:
    """The leading system messages (``instructions``, then ``system``/``developer``
    items) as one: templates that take one system prompt refuse a second one."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    if lead < 2:
        return messages
    text = TEXT_SEPARATOR.join(m.content for m in messages[:lead] if isinstance(m.content, str))
    return [GatewayMessage(role="system", content=text), *messages[lead:]]


def to_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """``request`` as the session's chat request (see the module's docstring);
    ``Unsupported`` names what cannot be rendered."""
    if request.previous_response_id is not None:
        raise Unsupported(
            "previous_response_id", "the gateway stores no responses: send the whole conversation as input"
        )
    messages: list[GatewayMessage] = []
    if request.instructions is not None:
        messages.append(GatewayMessage(role="system", content=request.instructions))
    if isinstance(request.input, str):
        messages.append(GatewayMessage(role="user", content=request.input))
    else:
        messages.extend(_items(request.input))
    if not messages:
        raise Unsupported("input", "there is nothing to answer: the input has no message")
    messages = _one_system(messages)
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(request.tools or [])]
    extra = request.model_extra or {}
    text, reasoning = extra.get("text"), extra.get("reasoning")
    return chat_request(
        _CHAT_PARAMS,
        model=request.model,
        messages=messages,
        tools=tools or None,
        stream=request.stream,
        max_tokens=request.max_output_tokens,
        tool_choice=request.tool_choice,
        response_format=text.get("format") if isinstance(text, dict) else None,
        reasoning_effort=reasoning.get("effort") if isinstance(reasoning, dict) else None,
    )


# The chat request's fields that come from a Responses field of another name.
_CHAT_PARAMS = {
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "max_tokens": "max_output_tokens",
}


def output_items(reply: Reply) -> list[OutputMessage | FunctionCallItem]:
    """The reply as output items: its text (when any, or when there are no calls),
    then one ``function_call`` per call."""
    items: list[OutputMessage | FunctionCallItem] = []
    if reply.content or not reply.tool_calls:
        items.append(
            OutputMessage(
                id=f"msg_{secrets.token_hex(16)}", status="completed", content=[OutputText(text=reply.content or "")]
            )
        )
    for call in reply.tool_calls:
        items.append(
            FunctionCallItem(
                id=f"fc_{secrets.token_hex(16)}",
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    return items

"""The tool-call wire format in the model's text: Hermes/Qwen ``<tool_call>`` blocks.

A reply calls tools by writing, once per call::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

This is the format of Hermes 2 Pro, Qwen 2.5/3 and vLLM's ``hermes`` parser. Tools
are presented to the model by the chat template's own ``tools`` support when it has
one (Qwen's writes the section below itself); otherwise (SmolLM2's ChatML template
ignores ``tools``) the same section is put in the system prompt, so every model sees
the format it is asked to answer in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rollserve.llm.tokenizer import ChatTokenizer

# vLLM's hermes parser also accepts a final block the model never closed (cut at
# max_tokens or a stop word right after the JSON); so do we.
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")

CALL_FORMAT = (
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    index: int  # position in the reply, for ids and error messages


@dataclass
class MalformedCall:
    message: str  # what the model is told
    index: int


@dataclass
class ParsedReply:
    # Every block in reply order: answers go back in the order the calls were made
    # (a chat API pairs them with its call ids by position).
    items: list[ToolCall | MalformedCall] = field(default_factory=list)

    @property
    def calls(self) -> list[ToolCall]:
        return [item for item in self.items if isinstance(item, ToolCall)]

    @property
    def errors(self) -> list[str]:
        return [item.message for item in self.items if isinstance(item, MalformedCall)]

    @property
    def has_calls(self) -> bool:
        return bool(self.items)


def parse_tool_calls(reply: str) -> ParsedReply:
    """Every ``<tool_call>`` block of ``reply``, in order; malformed ones as errors."""
    parsed = ParsedReply()
    for index, match in enumerate(_BLOCK.finditer(reply)):
        body = _FENCE.sub("", match.group(1).strip())
        call, error = _parse_one(body, index)
        parsed.items.append(call if call is not None else MalformedCall(
            f"Error: tool call {index + 1} was not understood: {error}. {CALL_FORMAT}", index))
    return parsed


def _parse_one(body: str, index: int) -> tuple[ToolCall | None, str]:
    if not body:
        return None, "the <tool_call> block is empty"
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(data, dict):
        return None, "the block must hold one JSON object"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return None, 'the object needs a "name" (the tool to call)'
    # Some models write "parameters", or the arguments as a JSON string (OpenAI style).
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, '"arguments" is a string that is not a JSON object'
    if not isinstance(arguments, dict):
        return None, '"arguments" must be a JSON object'
    return ToolCall(name=name, arguments=arguments, index=index), ""


def format_tool_call(name: str, arguments: dict) -> str:
    """The block a model should write to call ``name`` (for prompts and test doubles)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- presenting tools to the model --------------------------------------------------------
def template_tools(schemas: list[dict]) -> list[dict]:
    """Schemas in the ``{"type": "function", "function": ...}`` shape templates expect."""
    return [{"type": "function", "function": schema} for schema in schemas]


def template_supports_tools(tokenizer: ChatTokenizer) -> bool:
    """Whether the chat template renders a ``tools`` argument at all.

    Asked by rendering, not by reading the template source: a template that ignores
    ``tools`` (SmolLM2) renders the same text with and without it.
    """
    probe = [{"role": "user", "content": "hi"}]
    tool = template_tools([{"name": "probe_tool", "description": "d", "parameters": {"type": "object", "properties": {}}}])
    try:
        with_tools = tokenizer.render(probe, add_generation_prompt=True, tools=tool)
    except Exception:  # a template that chokes on tools cannot present them
        return False
    return with_tools != tokenizer.render(probe, add_generation_prompt=True) and "probe_tool" in with_tools


def tools_system_section(schemas: list[dict]) -> str:
    """The Hermes/Qwen tools section, for templates that do not write one."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in template_tools(schemas))
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n{CALL_FORMAT}"
    )


@dataclass
class ToolPresentation:
    """How one conversation shows its tools: via the template or in the system prompt."""

    system_prompt: str  # the system message to send (with the tools section if needed)
    template_tools: list[dict] | None  # what to pass the template as ``tools``, or None
    wrap_responses: bool  # put tool results in <tool_response> (the template will not)


def present_tools(
    schemas: list[dict], system_prompt: str, tokenizer: ChatTokenizer | None,
    where: Literal["auto", "template", "prompt"] = "auto",
) -> ToolPresentation:
    """``auto``: through the template when it renders tools, else in the system prompt.
    ``template``: always as ``tools`` (a chat API backend takes them natively)."""
    if where == "template" or (
        where == "auto" and tokenizer is not None and template_supports_tools(tokenizer)
    ):
        return ToolPresentation(system_prompt, template_tools(schemas), wrap_responses=False)
    section = tools_system_section(schemas)
    prompt = f"{system_prompt}\n\n{section}" if system_prompt else section
    return ToolPresentation(prompt, None, wrap_responses=True)


def tool_message(content: str, name: str | None, wrap: bool) -> dict:
    """A tool result as a chat message. ChatML templates render role "tool" as
    ``<|im_start|>tool``; Qwen's wraps it in <tool_response> itself, others get it here."""
    if wrap:
        content = f"<tool_response>\n{content}\n</tool_response>"
    message = {"role": "tool", "content": content}
    if name:
        message["name"] = name
    return message

"""The tool-call wire formats in the model's text, and how each is shown to the model.

Three formats, chosen per ``ToolEnv`` (``ToolEnvConfig.tool_format``):

``hermes`` (default): Hermes 2 Pro / Qwen 2.5-3 / vLLM's ``hermes`` parser; one block
per call::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

Tools are presented by the chat template's own ``tools`` support when it has one
(Qwen's writes the section below itself); otherwise (SmolLM2's ChatML template
ignores ``tools``) the same section is put in the system prompt, so every model sees
the format it is asked to answer in.

``json``: plain JSON function calls, as many models write them without special
tokens: the reply is or contains a JSON object ``{"name": ..., "arguments": ...}``,
OpenAI's shape ``{"type": "function", "function": {"name": ..., "arguments": "<JSON
string>"}}``, ``{"tool_calls": [...]}``, or a JSON list of these (in a ```json fence
or bare, around other text). Other JSON in the reply is left alone.

``bash_block``: mini-swe-agent's actions: a reply with exactly one fenced
```` ```bash ```` block calls the ``bash`` tool with the block as ``command``; two or
more blocks are a format error; none is no call. The episode is submitted by a
command whose output starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the rest
of the output is the submission; see ``ToolEnv``).

The ``json`` and ``bash_block`` instructions always go in the system prompt (a
template's tool section would ask for ``<tool_call>`` blocks). A malformed call is
never a crash: it becomes a ``MalformedCall`` whose message, with a reminder of the
format, is shown to the model (the agent's failure, counted by ``ToolEnv``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rollserve.llm.base import Message, Tokenizer

# vLLM's hermes parser also accepts a final block the model never closed (cut at
# max_tokens or a stop word right after the JSON); so do we.
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")

CALL_FORMAT = (
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
JSON_CALL_FORMAT = (
    "To call a function, reply with a JSON object holding the function name and its "
    'arguments: {"name": <function-name>, "arguments": <args-json-object>}. For several '
    "calls, reply with a JSON list of such objects."
)
BASH_CALL_FORMAT = (
    "Every reply must contain exactly ONE bash code block, holding one command (or "
    "several joined with && or ||), after a short explanation of your reasoning:\n\n"
    "THOUGHT: why this command helps.\n\n```bash\nyour_command_here\n```"
)
SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
BASH_SUBMIT = (
    f"When you are done, submit with a block whose first command is `echo {SUBMIT_MARKERS[0]}`; "
    "whatever the block prints after that line is your final output. You cannot continue "
    "working after submitting."
)

ToolFormat = Literal["hermes", "json", "bash_block"]
TOOL_FORMATS: tuple[str, ...] = ("hermes", "json", "bash_block")
_BASH_BLOCK = re.compile(r"```bash[ \t]*\n(.*?)\n?```", re.DOTALL)
_CALL_START = re.compile(r'[\[{]\s*(?:\{\s*)?"(?:name|function|tool_calls)"\s*:')


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


def parse_tool_calls(reply: str, fmt: ToolFormat = "hermes") -> ParsedReply:
    """Every call ``reply`` makes in format ``fmt``, in order; malformed ones as errors."""
    if fmt == "json":
        return parse_json_calls(reply)
    if fmt == "bash_block":
        return parse_bash_block(reply)
    if fmt != "hermes":
        raise ValueError(f"tool_format: expected one of {', '.join(TOOL_FORMATS)}, got {fmt!r}")
    parsed = ParsedReply()
    for index, match in enumerate(_BLOCK.finditer(reply)):
        body = _FENCE.sub("", match.group(1).strip())
        call, error = _parse_one(body, index)
        parsed.items.append(
            call
            if call is not None
            else MalformedCall(f"Error: tool call {index + 1} was not understood: {error}. {CALL_FORMAT}", index)
        )
    return parsed


def _parse_one(body: str, index: int) -> tuple[ToolCall | None, str]:
    if not body:
        return None, "the <tool_call> block is empty"
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    return _call_from(data, index)


def _call_from(data: Any, index: int) -> tuple[ToolCall | None, str]:
    """A call from a parsed JSON value: ``{"name", "arguments"}`` or OpenAI's
    ``{"function": {"name", "arguments"}}``."""
    if isinstance(data, dict) and isinstance(data.get("function"), dict):
        data = data["function"]
    if not isinstance(data, dict):
        return None, "a call must be one JSON object"
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


# --- json --------------------------------------------------------------------------------
def parse_json_calls(reply: str) -> ParsedReply:
    """JSON function calls anywhere in ``reply``: objects with a ``name`` (or OpenAI's
    ``function``), ``{"tool_calls": [...]}``, or lists of them. JSON that is not a call
    is ignored; something that starts like a call but does not parse is an error."""
    parsed = ParsedReply()
    decoder = json.JSONDecoder()
    position = 0
    while True:
        start = _next_json_start(reply, position)
        if start is None:
            return parsed
        try:
            value, end = decoder.raw_decode(reply, start)
        except json.JSONDecodeError as exc:
            if _CALL_START.match(reply, start):
                index = len(parsed.items)
                parsed.items.append(
                    MalformedCall(
                        _json_error(index, f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"), index
                    )
                )
                position = _end_of_bracketed(reply, start)  # not its inner objects again
            else:
                position = start + 1
            continue
        for item in _call_candidates(value):
            index = len(parsed.items)
            call, error = _call_from(item, index)
            parsed.items.append(call if call is not None else MalformedCall(_json_error(index, error), index))
        position = end


def _next_json_start(text: str, position: int) -> int | None:
    starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
    return min(starts) if starts else None


def _call_candidates(value: Any) -> list[Any]:
    """The items of a JSON value that are (meant to be) calls."""
    if isinstance(value, dict):
        if isinstance(value.get("tool_calls"), list):
            return list(value["tool_calls"])
        return [value] if ("name" in value or "function" in value) else []
    if isinstance(value, list) and any(isinstance(v, dict) and ("name" in v or "function" in v) for v in value):
        return list(value)  # a list of calls; a stray item in it is an error
    return []


def _json_error(index: int, error: str) -> str:
    return f"Error: tool call {index + 1} was not understood: {error}. {JSON_CALL_FORMAT}"


def _end_of_bracketed(text: str, start: int) -> int:
    """Where the bracketed value opening at ``start`` ends (JSON strings respected),
    or the end of ``text`` if it never closes."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


# --- bash blocks ----------------------------------------------------------------------------
def parse_bash_block(reply: str) -> ParsedReply:
    """Exactly one ```bash block is a call of ``bash``; more are a format error."""
    blocks = _BASH_BLOCK.findall(reply)
    if not blocks:
        return ParsedReply()
    if len(blocks) > 1:
        return ParsedReply(
            [
                MalformedCall(
                    f"Error: your reply has {len(blocks)} bash code blocks; write exactly one "
                    f"(join commands with && if you need several). {BASH_CALL_FORMAT}",
                    0,
                )
            ]
        )
    command = blocks[0].strip("\n")
    if not command.strip():
        return ParsedReply([MalformedCall(f"Error: the bash code block is empty. {BASH_CALL_FORMAT}", 0)])
    return ParsedReply([ToolCall(name="bash", arguments={"command": command}, index=0)])


def submitted_output(text: str) -> str | None:
    """For ``bash_block``: the submission if a command's output starts with a submit
    marker (the output after that line, without the shell's trailing notes)."""
    lines = text.lstrip().splitlines()
    if not lines or lines[0].strip() not in SUBMIT_MARKERS:
        return None
    rest = lines[1:]
    while rest and re.fullmatch(r"\[[^\]]*\]", rest[-1].strip()):  # "[exit code: 0]" and such
        rest.pop()
    return "\n".join(rest)


def format_tool_call(name: str, arguments: dict, fmt: ToolFormat = "hermes") -> str:
    """The text a model should write to call ``name`` in ``fmt`` (for prompts, test
    doubles, and chat APIs' structured calls handed to a text environment)."""
    if fmt == "json":
        return json.dumps({"name": name, "arguments": arguments})
    if fmt == "bash_block" and name == "bash" and isinstance(arguments.get("command"), str):
        return f"```bash\n{arguments['command']}\n```"
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- presenting tools to the model --------------------------------------------------------
def template_tools(schemas: list[dict]) -> list[dict]:
    """Schemas in the ``{"type": "function", "function": ...}`` shape templates expect."""
    return [{"type": "function", "function": schema} for schema in schemas]


def template_supports_tools(tokenizer: Tokenizer) -> bool:
    """Whether the chat template renders a ``tools`` argument at all: the tokenizer
    knows (a local one renders a probe once, a serving backend's probed it in
    ``ready()``; before that it is a ``TokenizerError``, masked)."""
    return tokenizer.renders_tools


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


def json_system_section(schemas: list[dict]) -> str:
    """The tools section for plain JSON calls."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in template_tools(schemas))
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"The functions and their JSON-schema arguments:\n{listed}\n\n{JSON_CALL_FORMAT}"
    )


def bash_system_section(schemas: list[dict]) -> str:
    """The instructions for ``bash_block`` (mini-swe-agent's way of acting)."""
    bash = next((s for s in schemas if s.get("name") == "bash"), None)
    about = ""
    if bash and bash.get("description"):
        about = f"You act through a bash shell: {bash['description']}\n\n"
    return f"# Acting\n\n{about}{BASH_CALL_FORMAT}\n\n{BASH_SUBMIT}"


def present_tools(
    schemas: list[dict],
    system_prompt: str,
    tokenizer: Tokenizer | None,
    where: Literal["auto", "template", "prompt"] = "auto",
    fmt: ToolFormat = "hermes",
) -> ToolPresentation:
    """``auto``: through the template when it renders tools, else in the system prompt.
    ``template``: always as ``tools`` (a chat API backend takes them natively).
    ``json`` and ``bash_block`` instructions go in the system prompt unless ``template``
    is asked for (a template's tools section asks for Hermes blocks)."""
    if fmt != "hermes" and where != "template":
        section = json_system_section(schemas) if fmt == "json" else bash_system_section(schemas)
        prompt = f"{system_prompt}\n\n{section}" if system_prompt else section
        return ToolPresentation(prompt, None, wrap_responses=False)
    if where == "template" or (where == "auto" and tokenizer is not None and template_supports_tools(tokenizer)):
        return ToolPresentation(system_prompt, template_tools(schemas), wrap_responses=False)
    section = tools_system_section(schemas)
    prompt = f"{system_prompt}\n\n{section}" if system_prompt else section
    return ToolPresentation(prompt, None, wrap_responses=True)


def tool_message(content: str, name: str | None, wrap: bool) -> Message:
    """A tool result as a chat message. ChatML templates render role "tool" as
    ``<|im_start|>tool``; Qwen's wraps it in <tool_response> itself, others get it here."""
    if wrap:
        content = f"<tool_response>\n{content}\n</tool_response>"
    message: Message = {"role": "tool", "content": content}
    if name:
        message["name"] = name
    return message

"""Hermes/Qwen tool-call parsing and how tools are presented to a model."""

from __future__ import annotations

import copy

from rollserve.agent.tool_calls import (
    format_tool_call,
    parse_tool_calls,
    present_tools,
    template_supports_tools,
    tool_message,
)
from rollserve.agent.tools import FinishTool
from rollserve.llm.tokens.tokenizer import ChatTokenizer

BASH_SCHEMA = {
    "name": "bash",
    "description": "run",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


# --- parsing -------------------------------------------------------------------------------
def test_one_good_call():
    reply = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    parsed = parse_tool_calls(reply)
    assert not parsed.errors and len(parsed.calls) == 1
    assert parsed.calls[0].name == "bash" and parsed.calls[0].arguments == {"command": "ls -la"}


def test_several_calls_in_order():
    reply = "".join(format_tool_call("bash", {"command": f"echo {i}"}) for i in range(3))
    parsed = parse_tool_calls("thinking...\n" + reply)
    assert [c.arguments["command"] for c in parsed.calls] == ["echo 0", "echo 1", "echo 2"]
    assert [c.index for c in parsed.calls] == [0, 1, 2]


def test_malformed_blocks_become_errors_next_to_good_calls():
    reply = (
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>'  # broken JSON
        + format_tool_call("bash", {"command": "pwd"})
        + '<tool_call>["not", "an", "object"]</tool_call>'
        + '<tool_call>{"arguments": {}}</tool_call>'
        + '<tool_call>{"name": "bash", "arguments": 5}</tool_call>'
        + "<tool_call>   </tool_call>"
    )
    parsed = parse_tool_calls(reply)
    assert [c.arguments for c in parsed.calls] == [{"command": "pwd"}]
    assert len(parsed.errors) == 5
    assert "invalid JSON" in parsed.errors[0] and "<tool_call>" in parsed.errors[0]  # shows the format
    assert "one JSON object" in parsed.errors[1]
    assert '"name"' in parsed.errors[2]
    assert '"arguments" must be a JSON object' in parsed.errors[3]
    assert "empty" in parsed.errors[4]


def test_no_call():
    parsed = parse_tool_calls("The answer is 42.")
    assert not parsed.has_calls and parsed.calls == [] and parsed.errors == []


def test_lenient_forms_models_produce():
    unclosed = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}'  # cut at a stop word
    assert parse_tool_calls(unclosed).calls[0].arguments == {"command": "ls"}
    as_string = '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert parse_tool_calls(as_string).calls[0].arguments == {"command": "ls"}
    fenced = '<tool_call>\n```json\n{"name": "bash", "parameters": {"command": "ls"}}\n```\n</tool_call>'
    assert parse_tool_calls(fenced).calls[0].arguments == {"command": "ls"}


# --- presentation ---------------------------------------------------------------------------
# A tool-aware template (it writes the tools section itself), rendered by the real tokenizer.
QWEN_LIKE_TEMPLATE = """
{%- if tools -%}
{{- '<|im_start|>system\n# Tools\n<tools>\n' -}}
{%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
{{- '</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def qwen_like(tok: ChatTokenizer) -> ChatTokenizer:
    """``tok`` with the tool-aware template above."""
    hf = copy.deepcopy(tok.hf)
    hf.chat_template = QWEN_LIKE_TEMPLATE
    return ChatTokenizer(hf, name="qwen-like")


def test_smollm2_template_has_no_tool_support_so_the_prompt_carries_the_schemas(tok):
    assert not template_supports_tools(tok)
    schemas = [BASH_SCHEMA, FinishTool().schema]
    shown = present_tools(schemas, "You are an agent.", tok)
    assert shown.template_tools is None and shown.wrap_responses
    assert shown.system_prompt.startswith("You are an agent.\n\n# Tools")
    assert '"name": "bash"' in shown.system_prompt and '"name": "finish"' in shown.system_prompt
    assert "<tool_call>" in shown.system_prompt


def test_tool_aware_template_gets_the_schemas_as_tools(tok):
    template = qwen_like(tok)
    assert template_supports_tools(template)
    shown = present_tools([BASH_SCHEMA], "You are an agent.", template)
    assert shown.system_prompt == "You are an agent."
    assert shown.template_tools == [{"type": "function", "function": BASH_SCHEMA}]
    assert not shown.wrap_responses


def test_chatml_renders_a_tool_message_as_its_own_role(tok):
    message = tool_message("file.txt", "bash", wrap=True)
    rendered = tok.render(
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}, message], add_generation_prompt=True
    )
    assert (
        "<|im_start|>tool\n<tool_response>\nfile.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in rendered

"""The JSON and fenced-bash tool-call formats: parsing, presentation, and ToolEnv
episodes in each (a malformed call is told to the model and counted, never a crash)."""

from __future__ import annotations

import json

import pytest

from rollserve.agent.loop import LoopStats, _tool_calls_as_text, run_agent_loop
from rollserve.agent.tool_calls import (
    BASH_CALL_FORMAT,
    JSON_CALL_FORMAT,
    SUBMIT_MARKERS,
    format_tool_call,
    parse_tool_calls,
    present_tools,
    submitted_output,
)
from rollserve.agent.tool_env import NUDGES, ToolEnv, ToolEnvConfig
from rollserve.agent.tools import FinishTool, Tool, function_schema
from rollserve.agent.trajectory import Trajectory
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.testing import FakeVLLM

from .test_tool_calls import BASH_SCHEMA, qwen_like


class Echo(Tool):
    schema = function_schema("echo", "say it back", {"text": {"type": "string"}}, ["text"])

    async def __call__(self, args):
        return args["text"]


class FakeBash(Tool):
    """A stand-in shell: echoes what ``echo`` prints, records every command."""

    schema = BASH_SCHEMA

    def __init__(self):
        self.commands: list[str] = []

    async def __call__(self, args):
        self.commands.append(args["command"])
        printed = [line[5:] for line in args["command"].splitlines() if line.startswith("echo ")]
        return "\n".join(printed + ["[exit code: 0]"])


# --- json ----------------------------------------------------------------------------------
def test_json_calls_in_the_shapes_models_write():
    plain = 'I will list the files.\n{"name": "bash", "arguments": {"command": "ls"}}'
    assert [(c.name, c.arguments) for c in parse_tool_calls(plain, "json").calls] == [("bash", {"command": "ls"})]
    openai = json.dumps(
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "pwd"})}}
    )
    assert parse_tool_calls(openai, "json").calls[0].arguments == {"command": "pwd"}
    listed = (
        "```json\n"
        + json.dumps([{"name": "echo", "arguments": {"text": "a"}}, {"name": "echo", "arguments": {"text": "b"}}])
        + "\n```"
    )
    parsed = parse_tool_calls(listed, "json")
    assert [c.arguments["text"] for c in parsed.calls] == ["a", "b"] and [c.index for c in parsed.calls] == [0, 1]
    wrapped = json.dumps({"tool_calls": [{"function": {"name": "echo", "arguments": {"text": "x"}}}]})
    assert parse_tool_calls(wrapped, "json").calls[0].name == "echo"
    # A Hermes block holds a JSON call too: read it.
    assert parse_tool_calls(format_tool_call("echo", {"text": "h"}), "json").calls[0].arguments == {"text": "h"}


def test_json_that_is_not_a_call_is_left_alone():
    for reply in ('The answer is {"x": 4}.', "[1, 2, 3]", "no json here", "{broken prose"):
        parsed = parse_tool_calls(reply, "json")
        assert not parsed.has_calls, reply


def test_malformed_json_calls_become_errors():
    unclosed = '{"name": "bash", "arguments": {"command": "ls"}'  # one brace short
    parsed = parse_tool_calls(unclosed, "json")
    assert parsed.calls == [] and len(parsed.errors) == 1  # not its inner object as a call
    assert "invalid JSON" in parsed.errors[0] and JSON_CALL_FORMAT in parsed.errors[0]
    mixed = json.dumps(
        [
            {"name": "echo", "arguments": {"text": "ok"}},
            "stray",
            {"name": "echo", "arguments": 5},
            {"arguments": {}, "function": "f"},
        ]
    )
    parsed = parse_tool_calls(mixed, "json")
    assert [c.arguments for c in parsed.calls] == [{"text": "ok"}]
    assert len(parsed.errors) == 3
    assert "one JSON object" in parsed.errors[0] and '"arguments" must be' in parsed.errors[1]


# --- bash blocks ------------------------------------------------------------------------------
def test_exactly_one_bash_block_is_a_bash_call():
    reply = "THOUGHT: look around.\n\n```bash\nls -la && cat README\n```"
    (call,) = parse_tool_calls(reply, "bash_block").calls
    assert call.name == "bash" and call.arguments == {"command": "ls -la && cat README"}
    assert not parse_tool_calls("Just thinking, no action.", "bash_block").has_calls
    assert not parse_tool_calls("```python\nprint(1)\n```", "bash_block").has_calls


def test_two_bash_blocks_or_an_empty_one_are_format_errors():
    two = "```bash\nls\n```\nand then\n```bash\npwd\n```"
    parsed = parse_tool_calls(two, "bash_block")
    assert parsed.calls == [] and "2 bash code blocks" in parsed.errors[0]
    assert BASH_CALL_FORMAT in parsed.errors[0]
    assert "empty" in parse_tool_calls("```bash\n\n```", "bash_block").errors[0]


@pytest.mark.parametrize("fmt", ["hermes", "json", "bash_block"])
def test_format_then_parse_round_trips(fmt):
    call = parse_tool_calls("x " + format_tool_call("bash", {"command": "echo hi"}, fmt), fmt).calls[0]
    assert call.name == "bash" and call.arguments == {"command": "echo hi"}
    # A chat API's structured calls reach a text environment in its own format.
    text = _tool_calls_as_text([{"id": "c", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}], fmt)
    assert parse_tool_calls(text, fmt).calls[0].arguments == {"command": "ls"}


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="tool_format"):
        parse_tool_calls("x", "xml")  # type: ignore[arg-type]


def test_submit_marker():
    assert submitted_output(f"{SUBMIT_MARKERS[0]}\nthe patch\nline 2\n[exit code: 0]") == "the patch\nline 2"
    assert submitted_output("hello\n" + SUBMIT_MARKERS[0]) is None


# --- presentation -------------------------------------------------------------------------------
def test_each_format_presents_its_own_instructions(tok):
    schemas = [BASH_SCHEMA, FinishTool().schema]
    as_json = present_tools(schemas, "Be brief.", qwen_like(tok), fmt="json")
    # Even a tool-aware template is not used: its section would ask for <tool_call> blocks.
    assert as_json.template_tools is None and "<tool_call>" not in as_json.system_prompt
    assert as_json.system_prompt.startswith("Be brief.\n\n# Tools")
    assert JSON_CALL_FORMAT in as_json.system_prompt and '"name": "finish"' in as_json.system_prompt
    as_bash = present_tools([BASH_SCHEMA], "Be brief.", tok, fmt="bash_block")
    assert "```bash" in as_bash.system_prompt and SUBMIT_MARKERS[0] in as_bash.system_prompt
    assert "<tool_call>" not in as_bash.system_prompt
    hermes = present_tools(schemas, "Be brief.", tok)
    assert "<tool_call>" in hermes.system_prompt  # the default is unchanged


# --- ToolEnv in each format ---------------------------------------------------------------------
async def test_tool_env_json_episode_and_errors():
    env = ToolEnv([Echo(), FinishTool()], "task", config=ToolEnvConfig(tool_format="json"))
    assert JSON_CALL_FORMAT in env.initial_messages()[0]["content"]
    assert [t["function"]["name"] for t in env.tool_schemas] == ["echo", "finish"]
    step = await env.step(
        '[{"name": "echo", "arguments": {"text": "one"}}, {"name": "echo", "arguments": {"text": "two"}}]'
    )
    assert [m["content"] for m in step.messages] == ["one", "two"] and not step.done
    step = await env.step('{"name": "echo", "arguments": {"text": "x"}')  # malformed
    assert "invalid JSON" in step.messages[0]["content"] and env.stats.parse_errors == 1
    step = await env.step("I am done, I think.")
    assert step.messages[0]["content"] == NUDGES["json"]
    step = await env.step('{"name": "finish", "arguments": {"answer": "42"}}')
    assert step.done and env.answer == "42"
    assert env.stats.as_stats()["tool_calls"] == 3 and env.stats.as_stats()["tool_parse_errors"] == 1


async def test_tool_env_bash_block_episode_submits_through_the_finish_tool():
    bash = FakeBash()
    finish = FinishTool()
    env = ToolEnv([bash, Echo(), finish], "Fix the bug.", config=ToolEnvConfig(tool_format="bash_block"))
    prompt = env.initial_messages()[0]["content"]
    assert "```bash" in prompt and '"echo"' not in prompt  # only bash can be called
    assert [t["function"]["name"] for t in env.tool_schemas] == ["bash"]
    step = await env.step("THOUGHT: look.\n```bash\necho hello\n```")
    assert step.messages[0]["content"] == "hello\n[exit code: 0]" and not step.done
    step = await env.step("```bash\nls\n```\n```bash\npwd\n```")
    assert "exactly one" in step.messages[0]["content"] and env.stats.parse_errors == 1
    step = await env.step("No block.")
    assert step.messages[0]["content"] == NUDGES["bash_block"]
    step = await env.step(f"Done.\n```bash\necho {SUBMIT_MARKERS[0]}\necho all fixed\n```")
    assert step.done and finish.finished and env.answer == "all fixed"
    assert bash.commands == ["echo hello", f"echo {SUBMIT_MARKERS[0]}\necho all fixed"]


async def test_bash_block_without_finish_tool_and_without_bash():
    env = ToolEnv([FakeBash()], "t", config=ToolEnvConfig(tool_format="bash_block"))
    step = await env.step(f"```bash\necho {SUBMIT_MARKERS[1]}\necho out\n```")
    assert step.done and env.answer == "out"
    with pytest.raises(ValueError, match="bash"):
        ToolEnv([Echo()], "t", config=ToolEnvConfig(tool_format="bash_block"))


async def test_json_episode_through_the_agent_loop(tok):
    replies = [
        'Let me echo.\n{"name": "echo", "arguments": {"text": "hi"}}',
        '{"name": "finish", "arguments": {"answer": "42"}}',
    ]
    env = ToolEnv(
        [Echo(), FinishTool()], "Say hi, then answer 42.", tokenizer=tok, config=ToolEnvConfig(tool_format="json")
    )
    async with FakeVLLM(tok, replies=replies) as server:
        router = Router()
        router.add(VLLMBackend(server.url, model="m"))
        trajectory = Trajectory()
        await run_agent_loop(
            env,
            router.session("t"),
            tok,
            SamplingParams(max_tokens=64),
            max_turns=4,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=LoopStats(),
        )
        await router.stop()
    assert trajectory.ended_by == "finished" and env.answer == "42"
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.messages[3]["content"] == "hi"
    assert trajectory.tools == env.tool_schemas and trajectory.fidelity.mismatches == 0

"""ToolEnv: calls run in order, errors reach the model, finish ends the episode."""

from __future__ import annotations

import asyncio

import pytest

from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.sandbox_tools import BashTool, EditorTool
from rollserve.agent.tool_calls import format_tool_call
from rollserve.agent.tool_env import ToolEnv, ToolEnvConfig
from rollserve.agent.tools import FinishTool, Tool, ToolError, function_schema
from rollserve.agent.trajectory import Trajectory
from rollserve.errors import InfraError
from rollserve.llm.base import Generation, SamplingParams
from tests.llm_doubles import TokenLevelSession


class Echo(Tool):
    schema = function_schema("echo", "say it back", {"text": {"type": "string"}}, ["text"])

    async def __call__(self, args):
        return args["text"]


class Broken(Tool):
    def __init__(self, exc):
        self.exc = exc
        self.schema = function_schema("broken", "fails", {}, [])

    async def __call__(self, args):
        raise self.exc


class Slow(Tool):
    schema = function_schema("slow", "sleeps", {}, [])

    async def __call__(self, args):
        await asyncio.sleep(10)
        return "never"


def call(name, **args):
    return format_tool_call(name, args)


async def test_calls_run_in_order_and_results_come_back_as_tool_messages():
    env = ToolEnv([Echo(), FinishTool()], "task")
    step = await env.step(call("echo", text="one") + call("echo", text="two"))
    assert not step.done
    assert [m["content"] for m in step.messages] == [
        "<tool_response>\none\n</tool_response>",
        "<tool_response>\ntwo\n</tool_response>",
    ]
    assert all(m["role"] == "tool" and m["name"] == "echo" for m in step.messages)
    assert env.stats.calls == 2 and env.stats.by_tool == {"echo": 2} and env.stats.errors == 0


async def test_finish_ends_the_episode_with_the_answer_and_skips_later_calls():
    env = ToolEnv([Echo(), FinishTool()], "task")
    step = await env.step(call("echo", text="a") + call("finish", answer="42") + call("echo", text="late"))
    assert step.done and step.reason == "finished"
    assert env.finished and env.answer == "42" and env.stats.calls == 2


async def test_malformed_call_is_an_error_for_the_model_and_counted():
    env = ToolEnv([Echo()], "task")
    step = await env.step('<tool_call>{"name": "echo", "arguments": {"text": </tool_call>')
    assert not step.done and len(step.messages) == 1
    assert "invalid JSON" in step.messages[0]["content"]
    assert env.stats.parse_errors == 1 and env.stats.as_stats()["tool_errors"] == 1


async def test_no_call_nudges_or_ends_as_configured():
    env = ToolEnv([Echo()], "task")
    step = await env.step("I think the answer is 4.")
    assert not step.done and step.messages[0]["role"] == "user"
    assert "did not call a tool" in step.messages[0]["content"]
    ending = ToolEnv([Echo()], "task", config=ToolEnvConfig(on_no_call="end"))
    step = await ending.step("I think the answer is 4.")
    assert step.done and step.reason == "no_tool_call"
    assert ending.stats.no_call_replies == 1


async def test_tool_errors_are_text_never_a_crash():
    env = ToolEnv(
        [Echo(), Broken(ToolError("refused: bad path")), Slow()], "task", config=ToolEnvConfig(call_timeout=0.2)
    )
    step = await env.step(
        call("nope")
        + call("echo")
        + call("echo", text="x", extra=1)
        + call("broken")
        + call("slow")
        + call("echo", text=5)
    )
    texts = [m["content"] for m in step.messages]
    assert "no tool named 'nope'" in texts[0] and "echo, broken, slow" in texts[0]
    assert "missing required argument(s): text" in texts[1]
    assert "unknown argument(s): extra" in texts[2]
    assert "Error: refused: bad path" in texts[3]
    assert "did not finish within 0.2 s" in texts[4]
    assert "'text' must be string" in texts[5]
    assert env.stats.unknown_tools == 1 and env.stats.errors == 5 and env.stats.timeouts == 1
    assert env.stats.as_stats() == {"tool_calls": 5, "tool_errors": 6, "tool_parse_errors": 0, "tool_timeouts": 1}


async def test_a_bug_in_a_tool_is_shown_but_infra_failures_propagate():
    env = ToolEnv([Broken(KeyError("oops"))], "task")
    step = await env.step(call("broken"))
    assert "broken failed: KeyError" in step.messages[0]["content"]
    infra = ToolEnv([Broken(InfraError("sandbox died"))], "task")
    with pytest.raises(InfraError):
        await infra.step(call("broken"))


async def test_calls_per_reply_are_capped():
    env = ToolEnv([Echo()], "task", config=ToolEnvConfig(max_calls_per_turn=2))
    step = await env.step("".join(call("echo", text=str(i)) for i in range(5)))
    assert len(step.messages) == 3 and "the last 3 were not run" in step.messages[2]["content"]


async def test_long_results_are_truncated():
    env = ToolEnv([Echo()], "task", config=ToolEnvConfig(max_result_chars=300))
    step = await env.step(call("echo", text="x" * 5000))
    assert len(step.messages[0]["content"]) < 500 and "dropped" in step.messages[0]["content"]


async def test_initial_messages_carry_the_tools_for_a_template_without_tool_support(tok):
    env = ToolEnv([Echo(), FinishTool()], "Compute 2+2.", system_prompt="Be brief.", tokenizer=tok)
    system, user = env.initial_messages()
    assert env.tools is None and system["content"].startswith("Be brief.\n\n# Tools")
    assert user == {"role": "user", "content": "Compute 2+2."}


# --- a whole episode through the real loop, tokenizer and a sandbox ------------------------------
class ScriptedLLM(TokenLevelSession):
    policy_version = 3

    def __init__(self, tok, replies):
        self.tok = tok
        self.replies = list(replies)
        self.prompts = []

    async def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.replies.pop(0)) + [self.tok.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "stop", backend="scripted")


async def test_episode_with_bash_editor_and_finish(tok, tmp_path):
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.local import LocalRuntime

    sandbox = await LocalRuntime(state_dir=tmp_path / "state").start(SandboxSpec())
    bash, editor, finish = BashTool(sandbox), EditorTool(sandbox), FinishTool()
    env = ToolEnv([bash, editor, finish], "Write hello.py and run it.", tokenizer=tok)
    replies = [
        "I'll create the file.\n"
        + call(
            "str_replace_editor",
            command="create",
            path="/workspace/hello.py",
            file_text="print('hello from the sandbox')\n",
        ),
        call("bash", command="python3 hello.py"),
        call("bash", command="cat missing.txt"),
        "Done.\n" + call("finish", answer="hello from the sandbox"),
    ]
    llm = ScriptedLLM(tok, replies)
    trajectory, stats = Trajectory(), LoopStats()
    try:
        await run_agent_loop(
            env,
            llm,
            tok,
            SamplingParams(max_tokens=200),
            max_turns=10,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=stats,
        )
    finally:
        await bash.close()
        await sandbox.close()
    assert trajectory.ended_by == "finished" and env.answer == "hello from the sandbox"
    tool_texts = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert "Created /workspace/hello.py" in tool_texts[0]
    assert "hello from the sandbox\n[exit code: 0]" in tool_texts[1]
    assert "No such file or directory" in tool_texts[2] and "[exit code: 1]" in tool_texts[2]
    assert env.stats.calls == 4 and env.stats.by_tool == {"str_replace_editor": 1, "bash": 2, "finish": 1}
    # Token fidelity: the append-only sequence equals a full render of the conversation.
    assert trajectory.fidelity.mismatches == 0 and trajectory.fidelity.template_checked
    assert len(trajectory.input_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)


async def test_answers_follow_the_order_of_the_calls_malformed_ones_included():
    env = ToolEnv([Echo()], "task")
    step = await env.step(call("echo", text="first") + "<tool_call>{oops</tool_call>" + call("echo", text="third"))
    contents = [m["content"] for m in step.messages]
    assert "first" in contents[0] and "not understood" in contents[1] and "third" in contents[2]


async def test_tools_can_be_given_to_the_template_or_an_api_natively(tok):
    env = ToolEnv([Echo()], "task", tokenizer=tok, config=ToolEnvConfig(tools_in="template"))
    assert env.tools == [{"type": "function", "function": Echo.schema}]
    assert "<tools>" not in env.initial_messages()[0]["content"]
    step = await env.step(call("echo", text="raw"))
    assert step.messages[0]["content"] == "raw"  # the template wraps tool results itself


async def test_an_agent_answers_a_waiting_program_with_is_input(tok, tmp_path):
    """Through the agent's own tool calls, in a bubblewrap sandbox with the handlers'
    bash settings (idle action: interrupt): a prompt comes back to the model while
    the program waits, and its next call answers it with is_input. A `timeout` from
    the model (idle timeout off) still interrupts, and the shell stays usable."""
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime
    from rollserve.sandbox.tools.bash import BashConfig

    if BubblewrapRuntime.unavailable_reason():
        pytest.skip(f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}")
    sandbox = await BubblewrapRuntime(state_dir=tmp_path / "state").start(SandboxSpec())
    bash = BashTool(sandbox, BashConfig(timeout=60.0, idle_timeout=30.0, interrupt_grace=5.0))
    env = ToolEnv([bash, FinishTool()], "Greet the program.", tokenizer=tok)
    replies = [
        call("bash", command='read -p "name? " who; echo hi $who'),
        call("bash", command="bob", is_input=True),
        call("bash", command="python3 -c 'print(int(input(\"n: \")) * 2)'", timeout=60),
        call("bash", command="21", is_input=True),
        call("bash", command="echo start; sleep 61.5", timeout=1),
        call("bash", command="echo still here"),
        call("bash", command='read -p "again? " it'),
        call("bash", command="echo moved on"),  # a new command, not an answer
        call("finish", answer="done"),
    ]
    trajectory, stats = Trajectory(), LoopStats()
    try:
        await run_agent_loop(
            env,
            ScriptedLLM(tok, replies),
            tok,
            SamplingParams(max_tokens=200),
            max_turns=12,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=stats,
        )
    finally:
        await bash.close()
        await sandbox.close()
    texts = [
        m["content"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
        for m in trajectory.messages
        if m["role"] == "tool"
    ]
    assert texts[0].startswith("name? \n[the command is waiting for input") and "is_input=true" in texts[0]
    assert texts[1] == "hi bob\n[exit code: 0]"
    assert texts[2].startswith("n: \n[the command is waiting for input")
    assert texts[3] == "42\n[exit code: 0]"
    assert "did not finish within 1 s" in texts[4] and "[exit code: 130]" in texts[4]
    assert texts[5] == "still here\n[exit code: 0]"
    assert texts[6].startswith("again? \n[the command is waiting for input")
    assert texts[7].startswith("moved on\n[the previous command was still running and was stopped first")
    assert texts[7].endswith("[exit code: 0]")
    assert env.stats.errors == 0 and trajectory.ended_by == "finished"

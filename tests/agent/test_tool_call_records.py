"""Each turn records the tool calls of its reply: in every tool format (the env's own
parse of the reply), and on a message-level backend (the chat API's calls, with ids)."""

from __future__ import annotations

import json

import pytest

from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.tool_calls import SUBMIT_MARKERS, format_tool_call
from rollserve.agent.tool_env import ToolEnv, ToolEnvConfig
from rollserve.agent.tools import FinishTool
from rollserve.agent.trajectory import Trajectory
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import ChatReply, Generation, SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.testing import FakeVLLM

from .test_tool_formats import FakeBash

BASH_DONE = f"```bash\necho {SUBMIT_MARKERS[0]}\necho 42\n```"


def finish_reply(fmt: str) -> str:
    """The last reply of an episode in ``fmt``: finish (bash_block: the submit marker)."""
    return BASH_DONE if fmt == "bash_block" else format_tool_call("finish", {"answer": "42"}, fmt)


@pytest.mark.parametrize("fmt", ["hermes", "json", "bash_block"])
async def test_the_step_carries_the_calls_it_read(fmt):
    env = ToolEnv([FakeBash(), FinishTool()], "t", config=ToolEnvConfig(tool_format=fmt))
    step = await env.step("Let me look.\n" + format_tool_call("bash", {"command": "echo hi"}, fmt))
    assert step.tool_calls == [{"name": "bash", "arguments": {"command": "echo hi"}, "id": None}]
    assert (await env.step("No call here.")).tool_calls == []


async def test_every_call_of_a_reply_is_recorded_malformed_ones_aside():
    env = ToolEnv([FakeBash(), FinishTool()], "t", config=ToolEnvConfig(max_calls_per_turn=2))
    reply = (
        format_tool_call("bash", {"command": "echo a"})
        + "<tool_call>{oops</tool_call>"
        + format_tool_call("bash", {"command": "echo b"})
        + format_tool_call("finish", {"answer": "x"})
    )
    step = await env.step(reply)
    # The third call was not run (two per reply), but the reply made it: it is recorded.
    assert [(c["name"], c["arguments"]) for c in step.tool_calls] == [
        ("bash", {"command": "echo a"}),
        ("bash", {"command": "echo b"}),
        ("finish", {"answer": "x"}),
    ]
    assert not step.done and env.stats.parse_errors == 1


@pytest.mark.parametrize("fmt", ["hermes", "json", "bash_block"])
async def test_turns_record_their_calls_in_every_format(tok, fmt):
    bash = FakeBash()
    env = ToolEnv([bash, FinishTool()], "Say hi, then answer 42.", tokenizer=tok, config=ToolEnvConfig(tool_format=fmt))
    replies = [
        "I will greet.\n" + format_tool_call("bash", {"command": "echo hi"}, fmt),
        "No tool this time.",
        finish_reply(fmt),
    ]
    async with FakeVLLM(tok, replies=replies) as server:
        router = Router()
        router.add(VLLMBackend(server.url, model="m"))
        trajectory = Trajectory()
        await run_agent_loop(
            env,
            router.session("t"),
            tok,
            SamplingParams(max_tokens=96),
            max_turns=5,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=LoopStats(),
        )
        await router.stop()
    assert trajectory.ended_by == "finished" and env.answer == "42"
    last = (
        {"name": "bash", "arguments": {"command": f"echo {SUBMIT_MARKERS[0]}\necho 42"}, "id": None}
        if fmt == "bash_block"
        else {"name": "finish", "arguments": {"answer": "42"}, "id": None}
    )
    assert [t.tool_calls for t in trajectory.turns] == [
        [{"name": "bash", "arguments": {"command": "echo hi"}, "id": None}],
        [],
        [last],
    ]


class ChatAPISession:
    """A trajectory's session on a message-level backend that answers with scripted
    ChatReplys (as an OpenAI-compatible API does, structured tool calls included)."""

    policy_version = None

    def __init__(self, replies: list[ChatReply]):
        self.replies = list(replies)
        self.sent: list[list[dict]] = []

    async def message_level(self) -> bool:
        return True

    def context_window(self) -> int | None:
        return None

    async def chat(self, messages, sampling, tools=None) -> ChatReply:
        self.sent.append(list(messages))
        return self.replies.pop(0)

    async def generate(self, prompt_ids, sampling) -> Generation:
        raise AssertionError("a message-level session is never asked for token ids")

    def close(self) -> None:
        return None


def api_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_a_chat_api_s_calls_are_recorded_with_their_ids(tok):
    bash = FakeBash()
    env = ToolEnv([bash, FinishTool()], "Say hi.", tokenizer=tok)
    llm = ChatAPISession(
        [
            ChatReply(
                "",
                "tool_calls",
                [api_call("c1", "bash", json.dumps({"command": "echo hi"})), api_call("c2", "bash", "{not json")],
                backend="api",
            ),
            ChatReply(format_tool_call("bash", {"command": "echo text"}), "stop", backend="api"),
            ChatReply("", "tool_calls", [api_call("c3", "finish", '{"answer": "42"}')], backend="api"),
        ]
    )
    trajectory = Trajectory()
    await run_agent_loop(
        env,
        llm,
        tok,
        SamplingParams(max_tokens=64),
        max_turns=5,
        max_context_tokens=4096,
        trajectory=trajectory,
        stats=LoopStats(),
    )
    assert trajectory.trainable is False and trajectory.ended_by == "finished"
    assert [t.tool_calls for t in trajectory.turns] == [
        [
            {"name": "bash", "arguments": {"command": "echo hi"}, "id": "c1"},
            {"name": "bash", "arguments": "{not json", "id": "c2"},
        ],  # as the API sent it
        [{"name": "bash", "arguments": {"command": "echo text"}, "id": None}],  # read in the text
        [{"name": "finish", "arguments": {"answer": "42"}, "id": "c3"}],
    ]
    assert bash.commands == ["echo hi", "echo text"] and env.answer == "42"
    # The tool results went back to the API with the ids of the calls they answer.
    answered = [m for m in llm.sent[1] if m["role"] == "tool"]
    assert [m.get("tool_call_id") for m in answered] == ["c1", "c2"]

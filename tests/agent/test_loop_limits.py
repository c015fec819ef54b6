"""The agent loop's limits and modes: context budget, turns cut by max_tokens, the
policy version of each turn, and the message-level path for chat APIs."""

import asyncio

from rollserve.agent.base import AgentEnv, Step
from rollserve.agent.loop import LoopStats, _answer_tool_calls, _tool_calls_as_text, run_agent_loop
from rollserve.agent.trajectory import Trajectory
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.llm.backends.openai_chat import OpenAIChatBackend
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.testing.fake_vllm import FakeVLLM
from tests.waiting import eventually


class Chatty(AgentEnv):
    """Never done: answers every reply with a fixed user message."""

    def __init__(self, answer="Go on."):
        self.answer = answer
        self.replies = []

    def initial_messages(self):
        return [{"role": "user", "content": "Tell me a story."}]

    async def step(self, reply):
        self.replies.append(reply)
        return Step(messages=[{"role": "user", "content": self.answer}])


async def run(llm, tok, env, max_turns=10, max_context=4096, max_tokens=64):
    trajectory = Trajectory()
    await run_agent_loop(
        env, llm, tok, SamplingParams(max_tokens=max_tokens), max_turns, max_context, trajectory, LoopStats()
    )
    return trajectory


async def test_the_episode_ends_before_the_context_limit(tok):
    async with FakeVLLM(tok, replies="Once upon a time there was a fox.") as server:
        router = Router()
        router.add(VLLMBackend(server.url))
        env = Chatty(answer="Go on, " + "please " * 20)
        trajectory = await run(router.session(), tok, env, max_context=150)
        await router.stop()
    assert trajectory.ended_by == "context_exhausted"
    assert len(trajectory.input_ids) < 150  # the messages that would not fit were not added
    assert trajectory.messages[-1]["role"] == "assistant"
    assert trajectory.fidelity.mismatches == 0
    for call in server.calls:  # no request ever asked past the limit
        assert len(call.prompt_ids) + call.request["max_tokens"] <= 150


async def test_a_turn_cut_by_max_tokens_is_marked_and_counted(tok):
    async with FakeVLLM(tok, replies="one two three four five six seven eight") as server:
        router = Router()
        router.add(VLLMBackend(server.url))
        trajectory = await run(router.session(), tok, Chatty(), max_turns=2, max_tokens=3)
        # The last turn gets only what is left of the context.
        tight = await run(
            router.session(), tok, Chatty(), max_turns=5, max_tokens=50, max_context=len(server.calls[0].prompt_ids) + 5
        )
        await router.stop()
    assert [t.finish_reason for t in trajectory.turns] == ["length", "length"]
    assert trajectory.truncated_turns == 2
    rollout = Rollout(
        spec=RolloutSpec(id="r", group_id="g", task_id="t", data_source="x", sample_index=0, instance={}),
        trajectory=trajectory,
        status="completed",
    )
    assert rollout.result().stats.truncated_turns == 2
    assert server.calls[-1].request["max_tokens"] == 5
    assert tight.ended_by == "context_exhausted" and tight.turns[0].finish_reason == "length"


async def test_each_turn_is_stamped_with_the_version_that_sampled_it(tok):
    release = asyncio.Event()

    async def reply(prompt_ids, text):
        await release.wait()
        return "ok"

    async with FakeVLLM(tok, replies=reply) as server:
        router = Router(policy_version=1)
        router.add(VLLMBackend(server.url))
        task = asyncio.create_task(run(router.session(), tok, Chatty(), max_turns=3))
        await eventually(lambda: server.calls, what="the first LLM call")
        pausing = asyncio.create_task(router.pause("finish"))
        release.set()
        await pausing
        await router.resume(policy_version=2)
        trajectory = await task
        await router.stop()
    assert [t.policy_version for t in trajectory.turns] == [1, 2, 2]
    assert trajectory.policy_versions == [1, 2]


async def test_a_chat_api_runs_the_episode_on_messages(tok):
    async with FakeVLLM(tok, replies=["First.", "Second."]) as server:
        router = Router(policy_version=4)
        router.add(OpenAIChatBackend(server.url + "/v1", name="api"))
        env = Chatty()
        trajectory = await run(router.session(), tok, env, max_turns=2)
        await router.stop()
    assert trajectory.trainable is False and trajectory.ended_by == "max_turns"
    assert trajectory.input_ids == [] and trajectory.loss_mask == []
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in trajectory.messages[1::2]] == ["First.", "Second."]
    assert env.replies == ["First.", "Second."]
    assert [(t.output_ids, t.backend, t.policy_version) for t in trajectory.turns] == [([], "api", 4), ([], "api", 4)]
    sent = server.calls[1].request
    assert sent["messages"] == trajectory.messages[:3] and sent["max_completion_tokens"] == 64
    assert server.calls[0].route == "/v1/chat/completions"
    result = trajectory.to_wire()
    assert result.trainable is False and result.tokens.input_ids == []


def test_structured_tool_calls_become_text_and_results_get_their_ids():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]
    text = _tool_calls_as_text(calls)
    assert text == '\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    answered = _answer_tool_calls([{"role": "tool", "content": "a.txt"}], calls)
    assert answered == [{"role": "tool", "content": "a.txt", "tool_call_id": "call_1"}]

"""The agent loop's time limit (who is charged when it passes) and the backend's
context window (the limit clamped to it; a refusal as the agent's context_exhausted),
with real router sessions on the scripted vLLM double."""

import asyncio

import pytest

from rollserve.agent.base import AgentEnv, Step
from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.trajectory import Trajectory
from rollserve.engine.rollout import Rollout, RolloutSpec, Timeouts, default_run_margin
from rollserve.errors import DeadlineFailure, PromptTooLongError
from rollserve.llm.backends.http import context_overflow
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.testing.fake_vllm import FakeVLLM


class Stalling(AgentEnv):
    """Each step takes ``seconds`` (a tool that sleeps); ``stop`` is recorded."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.stopped = 0

    def initial_messages(self):
        return [{"role": "user", "content": "Fix the bug."}]

    async def step(self, reply):
        await asyncio.sleep(self.seconds)
        return Step(messages=[{"role": "user", "content": "ok"}])

    async def stop(self):
        self.stopped += 1


async def episode(llm, tok, env, deadline_in=None, max_context=4096, max_tokens=16, stats=None):
    trajectory = Trajectory()
    loop = asyncio.get_running_loop()
    deadline = None if deadline_in is None else loop.time() + deadline_in
    await run_agent_loop(
        env,
        llm,
        tok,
        SamplingParams(max_tokens=max_tokens),
        50,
        max_context,
        trajectory,
        stats or LoopStats(),
        deadline=deadline,
    )
    return trajectory


async def test_tools_that_take_the_time_end_the_episode_at_the_limit(tok):
    async with FakeVLLM(tok, replies="working") as server:
        router = Router()
        router.add(VLLMBackend(server.url))
        env, stats = Stalling(seconds=30.0), LoopStats()
        trajectory = await asyncio.wait_for(episode(router.session(), tok, env, deadline_in=3.0, stats=stats), 20)
        await router.stop()
    assert trajectory.ended_by == "time_limit" and len(trajectory.turns) == 1
    assert env.stopped == 1  # told to stop what its tools still ran
    assert stats.env_seconds >= 0.5 and stats.env_seconds >= stats.llm_seconds


async def test_a_slow_backend_or_nothing_sampled_is_a_deadline_failure(tok):
    async with FakeVLLM(tok, replies="working", latency=0.6) as server:
        router = Router()
        router.add(VLLMBackend(server.url))
        with pytest.raises(DeadlineFailure, match="waiting on the LLM backend"):
            await asyncio.wait_for(episode(router.session(), tok, Stalling(0.01), deadline_in=1.5), 20)
        with pytest.raises(DeadlineFailure, match="before the policy sampled anything"):
            await asyncio.wait_for(episode(router.session(), tok, Stalling(0.01), deadline_in=0.2), 20)
        await router.stop()
    assert DeadlineFailure("x").kind == "timeout"


async def test_the_backend_window_clamps_the_episode(tok):
    async with FakeVLLM(tok, replies="Once upon a time there was a fox.", max_model_len=120) as server:
        router = Router()
        backend = VLLMBackend(server.url)
        router.add(backend)
        await backend.health()  # a health check reads the window
        trajectory = await episode(router.session(), tok, Stalling(0.0), max_context=4096)
        await router.stop()
    assert trajectory.ended_by == "context_exhausted" and len(trajectory.input_ids) <= 120
    assert all(c.status != 400 for c in server.calls)
    assert all(len(c.prompt_ids) + c.request["max_tokens"] <= 120 for c in server.calls)


async def test_a_refused_prompt_is_context_exhausted_or_too_long(tok):
    async with FakeVLLM(
        tok, replies="Once upon a time there was a fox.", max_model_len=120, report_max_model_len=False
    ) as server:
        router = Router()
        router.add(VLLMBackend(server.url))
        trajectory = await episode(router.session(), tok, Stalling(0.0), max_context=4096, max_tokens=40)
        assert trajectory.ended_by == "context_exhausted" and trajectory.turns
        assert server.calls[-1].status == 400
        # Refused before anything was sampled: nothing to score, so masked.
        with pytest.raises(PromptTooLongError, match="context window"):
            await episode(router.session(), tok, LongOpening(), max_context=4096)
        await router.stop()


class LongOpening(Stalling):
    def __init__(self) -> None:
        super().__init__(0.0)

    def initial_messages(self):
        return [{"role": "user", "content": "word " * 200}]


@pytest.mark.parametrize(
    "body",
    [
        # vLLM 0.32 (renderer, and the engine's own check), older vLLM, SGLang, llama.cpp
        (
            "This model's maximum context length is 2048 tokens. However, your prompt contains 2081 "
            "input tokens, which exceeds this limit even without any output tokens."
        ),
        "The decoder prompt (length 4097) is longer than the maximum model length of 4096.",
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "(4000 in the messages, 1000 in the completion)."
        ),
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        "Requested token count exceeds the model's maximum context length of 4096 tokens.",
        (
            '{"error": {"code": 400, "type": "exceed_context_size_error", "message": "the request '
            'exceeds the available context size, try increasing it"}}'
        ),
    ],
)
def test_context_refusals_are_recognised(body):
    assert context_overflow(400, body)
    assert not context_overflow(500, body)  # a server error stays the backend's


def test_other_bad_requests_are_not():
    assert not context_overflow(400, "temperature must be non-negative")
    assert not context_overflow(400, "The model `x` does not exist.")


def test_the_agent_deadline_keeps_the_margin_and_evals_time():
    spec = RolloutSpec(id="r", group_id="g", task_id="t", data_source="x", sample_index=0, instance={})
    rollout = Rollout(spec=spec, timeouts=Timeouts(run=600, eval=60, total=1800, run_margin=30))
    assert rollout.agent_deadline(0.0) is None  # outside RUN
    rollout.run_deadline, rollout.deadline = 600.0, 1800.0
    assert rollout.agent_deadline(0.0) == 570.0  # the stage's deadline less the margin
    rollout.deadline = 600.0  # the rollout's own deadline binds: EVAL's time is kept too
    assert rollout.agent_deadline(0.0) == 510.0
    assert rollout.agent_deadline(590.0) == 595.0  # never more than half of what is left
    assert default_run_margin(600) == 60 and default_run_margin(30) == 10

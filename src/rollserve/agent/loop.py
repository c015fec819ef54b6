"""The standard multi-turn loop: prompt → sample → act → append, until done.

A handler supplies an ``AgentEnv`` (opening messages, and what happens after each
reply); the loop owns the token bookkeeping so every handler gets exact tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from rollserve.agent.trajectory import Trajectory
from rollserve.llm.base import Generation, SamplingParams
from rollserve.llm.chat import PromptBuilder
from rollserve.llm.tokenizer import ChatTokenizer


class AgentLimits(BaseModel):
    """Per-request agent limits; unset fields take the handler's defaults."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = Field(None, ge=1, le=1000)
    max_context_tokens: int | None = Field(None, ge=16, le=10_000_000)


@dataclass
class Step:
    """What the environment answers to one assistant reply."""

    messages: list[dict] = field(default_factory=list)  # new user/tool messages
    done: bool = False
    reason: str = "finished"


class AgentEnv(Protocol):
    tools: list[dict] | None

    def initial_messages(self) -> list[dict]: ...

    async def step(self, reply: str) -> Step: ...


class LLMSession(Protocol):
    """A sticky handle on the inference layer for one trajectory."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    @property
    def policy_version(self) -> int | None: ...


@dataclass
class LoopStats:
    llm_seconds: float = 0.0
    env_seconds: float = 0.0


async def run_agent_loop(
    env: AgentEnv,
    llm: LLMSession,
    tokenizer: ChatTokenizer,
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    trajectory: Trajectory,
    stats: LoopStats,
) -> Trajectory:
    """Drive ``env`` with the policy until it is done or a limit ends the episode.

    ``trajectory`` is filled in place, so a cancelled or timed-out loop still leaves
    every token sampled so far in it.
    """
    builder = PromptBuilder(tokenizer, tools=env.tools)
    trajectory.fidelity = builder.fidelity
    messages = list(env.initial_messages())
    trajectory.messages = messages
    trajectory.add_prompt(builder.first(messages))
    ended_by = "max_turns"
    for turn_index in range(max_turns):
        budget = max_context_tokens - len(trajectory.input_ids)
        if budget <= 0:
            ended_by = "context_exhausted"
            break
        turn_sampling = sampling
        if sampling.max_tokens > budget:
            turn_sampling = sampling.model_copy(update={"max_tokens": budget})
        started = time.perf_counter()
        gen = await llm.generate(list(trajectory.input_ids), turn_sampling)
        stats.llm_seconds += time.perf_counter() - started
        trajectory.add_generation(gen, policy_version=llm.policy_version)
        reply = builder.assistant_content(gen.output_ids, gen.finish_reason)
        messages.append({"role": "assistant", "content": reply})

        started = time.perf_counter()
        step = await env.step(reply)
        stats.env_seconds += time.perf_counter() - started
        if step.done:
            ended_by = step.reason
            break
        if turn_index == max_turns - 1:
            break
        if gen.finish_reason == "length" and len(trajectory.input_ids) >= max_context_tokens:
            ended_by = "context_exhausted"
            break
        delta = builder.delta(messages, step.messages, trajectory.input_ids)
        messages.extend(step.messages)
        trajectory.add_prompt(delta)
    trajectory.ended_by = ended_by
    builder.check(messages, trajectory.input_ids)
    return trajectory

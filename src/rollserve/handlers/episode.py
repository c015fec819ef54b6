"""``run_episode``: a handler's RUN as the standard agent loop over its env, with or
without tools and sandboxes."""

from __future__ import annotations

import asyncio

from rollserve.agent import LoopStats, run_agent_loop
from rollserve.agent.base import AgentEnv
from rollserve.errors import InfraError
from rollserve.handlers.base import HandlerContext, RolloutView


async def run_episode(ctx: HandlerContext, rollout: RolloutView, env: AgentEnv) -> None:
    """The agent loop over ``env`` with the rollout's LLM session, sampling and limits,
    filling ``rollout.trajectory``; the episode ends itself at the rollout's agent
    deadline (``RolloutView.agent_deadline``: ended_by "time_limit"). LLM and tool
    time go to the result's ``timing`` and the env's counts (a ToolEnv's tool calls
    and errors) to its ``stats``, even when the loop is cancelled."""
    llm = rollout.llm
    if llm is None:
        raise InfraError("no LLM session was attached to the rollout before RUN")
    stats = LoopStats()
    try:
        await run_agent_loop(
            env,
            llm,
            ctx.tokenizer,
            rollout.sampling,
            max_turns=rollout.max_turns,
            max_context_tokens=rollout.max_context_tokens,
            trajectory=rollout.trajectory,
            stats=stats,
            deadline=rollout.agent_deadline(asyncio.get_running_loop().time()),
        )
    finally:
        rollout.add_time("llm", stats.llm_seconds)
        rollout.add_time("tools", stats.env_seconds)
        rollout.add_stats(env.counts())

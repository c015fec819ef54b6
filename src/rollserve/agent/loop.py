"""The standard multi-turn loop: prompt → sample → act → append, until done.

A handler supplies an ``AgentEnv`` (opening messages, and what happens after each
reply); the loop owns the token bookkeeping so every handler gets exact tokens.

Length: a turn may sample at most what is left of ``max_context_tokens``; the
episode ends with ``context_exhausted`` before a prompt would reach the limit (the
new messages that would not fit are not appended). An opening prompt that already
reaches it raises ``PromptTooLongError`` (masked): nothing was sampled to score. A turn cut by its token limit
keeps ``finish_reason: "length"``.

On a message-level backend (an API model: ``llm.message_level()`` is true) the
loop runs the same episode on messages only: no token ids, and the trajectory is
marked not trainable.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rollserve.agent.base import AgentEnv, Step, ToolCallRecord
from rollserve.agent.tool_calls import format_tool_call
from rollserve.agent.trajectory import Trajectory
from rollserve.errors import PromptTooLongError
from rollserve.llm.base import ChatReply, Generation, SamplingParams
from rollserve.llm.tokens.chat import Fidelity, prompt_builder
from rollserve.llm.tokens.tokenizer import ChatTokenizer

if TYPE_CHECKING:
    from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer


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
    tokenizer: "ChatTokenizer | BackendTokenizer",
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    trajectory: Trajectory,
    stats: LoopStats,
) -> Trajectory:
    """Drive ``env`` with the policy until it is done or a limit ends the episode.

    ``tokenizer``: a local ``ChatTokenizer``, or the serving backend's
    (``BackendTokenizer``: prompts are rendered over HTTP, never blocking the loop).

    ``trajectory`` is filled in place, so a cancelled or timed-out loop still leaves
    every token sampled so far in it.
    """
    message_level = getattr(llm, "message_level", None)
    if message_level is not None and await message_level():
        return await _run_chat_loop(env, llm, sampling, max_turns, max_context_tokens,
                                    trajectory, stats)
    builder = prompt_builder(tokenizer, tools=env.tools)
    trajectory.fidelity = builder.fidelity
    messages = _open_episode(env, trajectory)
    trajectory.add_prompt(await builder.afirst(messages))
    if len(trajectory.input_ids) >= max_context_tokens:
        raise PromptTooLongError(
            f"the opening prompt is {len(trajectory.input_ids)} tokens and max_context_tokens "
            f"is {max_context_tokens}: no room to sample, so nothing can be scored")
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
        turn = trajectory.add_generation(gen, policy_version=_version(gen, llm))
        reply = await builder.aassistant_content(gen.output_ids, gen.finish_reason)
        messages.append({"role": "assistant", "content": reply})

        step = await _timed_step(env, reply, stats)
        turn.tool_calls = list(step.tool_calls)
        if (reason := _episode_end(step, turn_index, max_turns)) is not None:
            ended_by = reason
            break
        if gen.finish_reason == "length" and len(trajectory.input_ids) >= max_context_tokens:
            ended_by = "context_exhausted"
            break
        delta = await builder.adelta(messages, step.messages, trajectory.input_ids)
        if len(trajectory.input_ids) + len(delta) >= max_context_tokens:
            ended_by = "context_exhausted"  # no room left to sample after these messages
            break
        messages.extend(step.messages)
        trajectory.add_prompt(delta)
    trajectory.ended_by = ended_by
    await builder.acheck(messages, trajectory.input_ids)
    return trajectory


def _tool_schemas(env: AgentEnv) -> list[dict[str, Any]] | None:
    """The tools the agent was offered (ChatCompletion shape), for the result."""
    return env.tool_schemas or env.tools


def _open_episode(env: AgentEnv, trajectory: Trajectory) -> list[dict]:
    """The episode's opening messages (also kept on ``trajectory``, with its tools)."""
    trajectory.tools = _tool_schemas(env)
    messages = list(env.initial_messages())
    trajectory.messages = messages
    return messages


async def _timed_step(env: AgentEnv, reply: str, stats: LoopStats) -> Step:
    """``env.step(reply)``, its time added to ``stats.env_seconds``."""
    started = time.perf_counter()
    step = await env.step(reply)
    stats.env_seconds += time.perf_counter() - started
    return step


def _episode_end(step: Step, turn_index: int, max_turns: int) -> str | None:
    """Why the episode ends after ``step`` (the env's reason, or "max_turns" after the
    last turn), or None when it goes on."""
    if step.done:
        return step.reason
    if turn_index == max_turns - 1:
        return "max_turns"
    return None


def _version(reply: Generation | ChatReply, llm: LLMSession) -> int | None:
    """The policy version that produced ``reply``: its own stamp (the router's, taken
    when the request was sent), else the session's current one."""
    return reply.policy_version if reply.policy_version is not None else llm.policy_version


async def _run_chat_loop(
    env: AgentEnv,
    llm: LLMSession,
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    trajectory: Trajectory,
    stats: LoopStats,
) -> Trajectory:
    """The episode on a message-level backend: messages in and out, no token ids."""
    trajectory.trainable = False
    trajectory.fidelity = Fidelity(append_only=False)
    messages = _open_episode(env, trajectory)
    ended_by = "max_turns"
    for turn_index in range(max_turns):
        started = time.perf_counter()
        reply: ChatReply = await llm.chat(list(messages), sampling, tools=env.tools)  # type: ignore[attr-defined]
        stats.llm_seconds += time.perf_counter() - started
        generation = Generation([], [], reply.finish_reason, backend=reply.backend)
        turn = trajectory.add_generation(generation, policy_version=_version(reply, llm))
        assistant: dict = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            assistant["tool_calls"] = reply.tool_calls
        messages.append(assistant)

        step = await _timed_step(env, reply.content + _tool_calls_as_text(
            reply.tool_calls, env.tool_format), stats)
        # The API's own calls (with their ids), else those the env read in the text.
        turn.tool_calls = _recorded_calls(reply.tool_calls) or list(step.tool_calls)
        if (reason := _episode_end(step, turn_index, max_turns)) is not None:
            ended_by = reason
            break
        usage = reply.usage or {}
        used = usage.get("total_tokens") or (
            (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0))
        if used >= max_context_tokens:
            ended_by = "context_exhausted"
            break
        messages.extend(_answer_tool_calls(step.messages, reply.tool_calls))
    trajectory.ended_by = ended_by
    return trajectory


def _tool_calls_as_text(tool_calls: list[dict], fmt: str = "hermes") -> str:
    """Structured tool calls of a chat API, written the way a token-level policy writes
    them (``fmt``: the environment's tool format), so the same environment reads both."""
    parts = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # the environment reports the malformed call to the model
        if fmt != "hermes" and isinstance(arguments, dict):
            parts.append("\n" + format_tool_call(function.get("name") or "", arguments, fmt))
            continue
        parts.append("\n<tool_call>\n" + json.dumps({"name": function.get("name"),
                                                    "arguments": arguments}) + "\n</tool_call>")
    return "".join(parts)


def _recorded_calls(tool_calls: list[dict[str, Any]]) -> list[ToolCallRecord]:
    """A chat API's structured tool calls as a turn records them: the arguments
    decoded when they are a JSON object, else kept as the API sent them."""
    records: list[ToolCallRecord] = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                decoded = json.loads(arguments)
            except ValueError:
                decoded = None
            arguments = decoded if isinstance(decoded, dict) else arguments
        elif not isinstance(arguments, dict):
            arguments = {} if arguments is None else json.dumps(arguments)
        call_id = call.get("id")
        records.append({"name": str(function.get("name") or ""), "arguments": arguments,
                        "id": call_id if isinstance(call_id, str) else None})
    return records


def _answer_tool_calls(new: list[dict], tool_calls: list[dict]) -> list[dict]:
    """Tool results as a chat API wants them: each with the id of the call it answers."""
    ids = iter([c.get("id") for c in tool_calls if c.get("id")])
    out = []
    for message in new:
        if message.get("role") == "tool" and "tool_call_id" not in message:
            call_id = next(ids, None)
            if call_id is not None:
                message = {**message, "tool_call_id": call_id}
        out.append(message)
    return out

"""The standard multi-turn loop: prompt → sample → act → append, until done.

A handler supplies an ``AgentEnv`` (opening messages, and what happens after each
reply); the loop owns the token bookkeeping so every handler gets exact tokens.

Length: a turn may sample at most what is left of ``max_context_tokens``; the
episode ends with ``context_exhausted`` before a prompt would reach the limit (the
new messages that would not fit are not appended). An opening prompt that already
reaches it raises ``PromptTooLongError`` (masked): nothing was sampled to score. A turn cut by its token limit
keeps ``finish_reason: "length"``.

The backend's context window (``llm.context_window()``: vLLM's and SGLang's
``max_model_len``, llama.cpp's ``n_ctx``) clamps ``max_context_tokens`` each turn, so
no request is sent longer than the backend takes; a backend that still refuses a
prompt as too long (``ContextWindowError``) ends the episode ``context_exhausted``
like the limit itself (scored), or, before anything was sampled, is a
``PromptTooLongError`` (masked).

Time: with a ``deadline`` (event-loop time) the episode ends itself there; see
``agent.clock`` for who is charged (``time_limit``, scored, or a masked
``DeadlineFailure``).

On a message-level backend (an API model: ``llm.message_level()`` is true) the
loop runs the same episode on messages only: no token ids, and the trajectory is
marked not trainable.
"""

from __future__ import annotations

import json
from typing import Any

from rollserve.agent.base import AgentEnv, EndedBy, Step, ToolCallRecord
from rollserve.agent.clock import EpisodeClock, LoopStats, TimeUp, stop_env
from rollserve.agent.tool_calls import ToolFormat, format_tool_call
from rollserve.agent.trajectory import Trajectory, Turn
from rollserve.errors import PromptTooLongError, context_window_error
from rollserve.llm.base import (
    ChatReply,
    Fidelity,
    Generation,
    LLMSession,
    Message,
    SamplingParams,
    Tokenizer,
)

__all__ = ["LLMSession", "LoopStats", "run_agent_loop"]


async def run_agent_loop(
    env: AgentEnv,
    llm: LLMSession,
    tokenizer: Tokenizer,
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    trajectory: Trajectory,
    stats: LoopStats,
    deadline: float | None = None,
) -> Trajectory:
    """Drive ``env`` with the policy until it is done or a limit ends the episode.

    ``tokenizer``: a local ``ChatTokenizer``, or the serving backend's
    (``BackendTokenizer``: prompts are rendered over HTTP, never blocking the loop);
    either makes the episode's ``PromptBuilder``.
    ``deadline``: event-loop time at which the episode ends itself (``agent.clock``).

    ``trajectory`` is filled in place, so a cancelled or timed-out loop still leaves
    every token sampled so far in it.
    """
    clock = EpisodeClock(deadline, stats)
    if await llm.message_level():
        return await _run_chat_loop(env, llm, sampling, max_turns, max_context_tokens, trajectory, clock)
    builder = tokenizer.prompt_builder(tools=env.tools)
    trajectory.fidelity = builder.fidelity
    messages = _open_episode(env, trajectory)
    trajectory.add_prompt(await builder.afirst(messages))
    limit = _context_limit(llm, max_context_tokens)
    _check_opening(len(trajectory.input_ids), limit, max_context_tokens)
    ended_by: EndedBy = "max_turns"
    for turn_index in range(max_turns):
        limit = _context_limit(llm, max_context_tokens)
        budget = limit - len(trajectory.input_ids)
        if budget <= 0:
            ended_by = "context_exhausted"
            break
        if clock.expired():
            ended_by = clock.end(trajectory)
            break
        gen = await _generate(llm, trajectory, _within(sampling, budget), clock)
        if isinstance(gen, str):
            ended_by = gen
            break
        turn = trajectory.add_generation(gen, policy_version=_version(gen, llm))
        reply = await builder.aassistant_content(gen.output_ids, gen.finish_reason)
        messages.append({"role": "assistant", "content": reply})

        step = await _step(env, reply, clock, trajectory, turn, [])
        if isinstance(step, str):
            ended_by = step
            break
        turn.tool_calls = list(step.tool_calls)
        if (reason := _episode_end(step, turn_index, max_turns)) is not None:
            ended_by = reason
            break
        if gen.finish_reason == "length" and len(trajectory.input_ids) >= limit:
            ended_by = "context_exhausted"
            break
        delta = await builder.adelta(messages, step.messages, trajectory.input_ids)
        if len(trajectory.input_ids) + len(delta) >= _context_limit(llm, max_context_tokens):
            ended_by = "context_exhausted"  # no room left to sample after these messages
            break
        messages.extend(step.messages)
        trajectory.add_prompt(delta)
    trajectory.ended_by = ended_by
    await builder.acheck(messages, trajectory.input_ids)
    return trajectory


def _context_limit(llm: LLMSession, max_context_tokens: int) -> int:
    """``max_context_tokens``, clamped to the backend's context window where it is known."""
    known = llm.context_window()
    return max_context_tokens if known is None else min(max_context_tokens, known)


def _check_opening(length: int, limit: int, max_context_tokens: int) -> None:
    """Raise ``PromptTooLongError`` when the opening prompt (``length`` tokens) leaves no
    room to sample under ``limit``."""
    if length < limit:
        return
    where = (
        f"max_context_tokens is {max_context_tokens}"
        if limit == max_context_tokens
        else f"the backend's context window is {limit} tokens"
    )
    raise PromptTooLongError(
        f"the opening prompt is {length} tokens and {where}: no room to sample, so nothing can be scored"
    )


def _tool_schemas(env: AgentEnv) -> list[dict[str, Any]] | None:
    """The tools the agent was offered (ChatCompletion shape), for the result."""
    return env.tool_schemas or env.tools


def _open_episode(env: AgentEnv, trajectory: Trajectory) -> list[Message]:
    """The episode's opening messages (also kept on ``trajectory``, with its tools)."""
    trajectory.tools = _tool_schemas(env)
    messages = list(env.initial_messages())
    trajectory.messages = messages
    return messages


def _within(sampling: SamplingParams, budget: int) -> SamplingParams:
    """``sampling``, its ``max_tokens`` cut to the ``budget`` left in the context."""
    if sampling.max_tokens > budget:
        return sampling.model_copy(update={"max_tokens": budget})
    return sampling


async def _generate(
    llm: LLMSession, trajectory: Trajectory, sampling: SamplingParams, clock: EpisodeClock
) -> Generation | EndedBy:
    """The next turn sampled on the trajectory's tokens, or why the episode ends
    instead (the time is up; the backend's context window is full)."""
    try:
        return await clock.llm(llm.generate(list(trajectory.input_ids), sampling))
    except TimeUp:
        return clock.end(trajectory)
    except Exception as error:
        return _context_exhausted(error, trajectory, "prompt does")


async def _step(
    env: AgentEnv, reply: str, clock: EpisodeClock, trajectory: Trajectory, turn: Turn, recorded: list[ToolCallRecord]
) -> Step | EndedBy:
    """The env's step on ``reply``, or, when the time runs out during it, why the episode
    ends: ``turn`` then records the ``recorded`` calls (a chat API's), else those the env
    reads in ``reply``, and the env's tools are stopped."""
    try:
        return await clock.step(env.step(reply))
    except TimeUp:
        turn.tool_calls = recorded or env.calls_in(reply)
        try:  # decided before the stop: stopping the tools is nobody's time
            return clock.end(trajectory)
        finally:
            await stop_env(env)


def _episode_end(step: Step, turn_index: int, max_turns: int) -> EndedBy | None:
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
    clock: EpisodeClock,
) -> Trajectory:
    """The episode on a message-level backend: messages in and out, no token ids."""
    trajectory.trainable = False
    trajectory.fidelity = Fidelity(append_only=False)
    messages = _open_episode(env, trajectory)
    ended_by: EndedBy = "max_turns"
    for turn_index in range(max_turns):
        if clock.expired():
            ended_by = clock.end(trajectory)
            break
        try:
            reply = await clock.llm(llm.chat(list(messages), sampling, tools=env.tools))
        except TimeUp:
            ended_by = clock.end(trajectory)
            break
        except Exception as error:
            ended_by = _context_exhausted(error, trajectory, "messages do")
            break
        generation = Generation([], [], reply.finish_reason, backend=reply.backend)
        turn = trajectory.add_generation(generation, policy_version=_version(reply, llm))
        assistant: Message = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            assistant["tool_calls"] = reply.tool_calls
        messages.append(assistant)

        text = reply.content + _tool_calls_as_text(reply.tool_calls, env.tool_format)
        # The API's own calls (with their ids), else those the env read in the text.
        recorded = _recorded_calls(reply.tool_calls)
        step = await _step(env, text, clock, trajectory, turn, recorded)
        if isinstance(step, str):
            ended_by = step
            break
        turn.tool_calls = recorded or list(step.tool_calls)
        if (reason := _episode_end(step, turn_index, max_turns)) is not None:
            ended_by = reason
            break
        usage = reply.usage or {}
        used = usage.get("total_tokens") or ((usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0))
        if used >= max_context_tokens:
            ended_by = "context_exhausted"
            break
        messages.extend(_answer_tool_calls(step.messages, reply.tool_calls))
    trajectory.ended_by = ended_by
    return trajectory


def _tool_calls_as_text(tool_calls: list[dict], fmt: ToolFormat = "hermes") -> str:
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
        parts.append(
            "\n<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments}) + "\n</tool_call>"
        )
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
        records.append(
            {
                "name": str(function.get("name") or ""),
                "arguments": arguments,
                "id": call_id if isinstance(call_id, str) else None,
            }
        )
    return records


def _answer_tool_calls(new: list[Message], tool_calls: list[dict]) -> list[Message]:
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


def _context_exhausted(error: Exception, trajectory: Trajectory, opening: str) -> EndedBy:
    """How an episode ends when its LLM call failed with ``error``: ``context_exhausted``
    (scored) when the backend refused for its context window after the policy sampled a
    turn (the backend's window, not ours, was the limit); ``PromptTooLongError`` (masked)
    when the opening prompt never fit; anything else is raised as it is."""
    if (overflow := context_window_error(error)) is None:
        raise error
    if not trajectory.turns:
        raise PromptTooLongError(
            f"the opening {opening} not fit the backend's context window: {overflow.message}"
        ) from error
    return "context_exhausted"

"""rollserve's ``RolloutResult`` as ProRL Agent Server's ``/process`` answers it.

- ``messages``: the chat view, up to the last assistant message (as ProRL's); every
  assistant message carries ``token_ids`` (the ids the policy sampled, verbatim),
  ``logprobs`` and ``input_ids`` (that turn's whole prompt: every earlier prompt delta
  and sampled id), plus ``tool_calls`` flattened to ``{"name", "arguments"}`` when the
  turn called tools: the calls the environment parsed, in whatever tool format the
  episode used (hermes, json, bash_block) or a chat API's structured calls. ``None``
  for the three ids on a message-level (not trainable) backend, as ProRL without
  token-level generation.
- ``critical_error``: ``timeout`` for a timed-out or cancelled rollout; the stage
  (``init`` | ``run`` | ``eval``) of an infrastructure failure; ``None`` otherwise
  (the agent's own failures are trained on, as ProRL's ``AgentToolCallError``).
- ``filter``: rollserve's ``mask`` (or any critical_error): do not train on it.
- ``resolved``: the evaluation's ``resolved`` if it has one, else reward >= 1;
  ``success``: the rollout completed without failure; ``finish``: the agent ended the
  episode itself; ``end_properly``: its last turn was not cut by max_tokens or the
  context limit; ``git_patch``: the evaluation's, if any; ``error``: the failure
  message; ``tools``: the tool schemas the agent was shown (ChatCompletion format).
- ``timing``: ProRL's keys (init_time, run_time, eval_time, others_time,
  counted_elapsed, timeout_triggered) from rollserve's timing.
- Added: ``instance_id``, ``trajectory_id`` (from the instance, as ProRL), and
  rollserve's ``rollout_id``, ``reward`` and ``mask_reason``.

Messages carry only the keys ProRL's do (``name``, ``tool_call_id``, ``tool_calls``
where they apply; the ids on assistant messages): the response is rendered without
unset fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import JsonValue

from rollserve.contract import (
    ChatMessage,
    JSONObject,
    RolloutResult,
    TerminalStatus,
    Timing,
    ToolCall,
    Trajectory,
)
from rollserve.contract.prorl import ProRLMessage, ProRLResult, ProRLTiming

CriticalError = Literal["init", "run", "eval", "timeout"]


def prorl_result(result: RolloutResult, instance: JSONObject, job_id: str | None = None) -> ProRLResult:
    """rollserve's result as ProRL's ``/process`` answers it (see the module doc)."""
    traj, failure = result.trajectory, result.failure
    evaluation = result.evaluation or {}
    critical_error: CriticalError | None = None
    if result.status in ("timed_out", "cancelled"):
        critical_error = "timeout"
    elif failure is not None and failure.kind != "agent":
        critical_error = "init" if failure.stage == "queue" else failure.stage
    last_turn = traj.turns[-1] if traj.turns else None
    resolved = evaluation.get("resolved")
    if not isinstance(resolved, bool):
        resolved = result.reward is not None and result.reward >= 1.0
    git_patch = evaluation.get("git_patch")
    return ProRLResult(
        instance_id=instance.get("instance_id"),
        trajectory_id=instance.get("trajectory_id"),
        job_id=job_id,
        git_patch=git_patch if isinstance(git_patch, str) else None,
        success=result.status == "completed" and failure is None,
        finish=traj.ended_by == "finished",
        messages=prorl_messages(traj),
        tools=traj.tools or [],
        end_properly=traj.ended_by != "context_exhausted"
        and not (last_turn is not None and last_turn.finish_reason == "length"),
        resolved=resolved and critical_error is None,
        critical_error=critical_error,
        filter=result.mask or critical_error is not None,
        error=failure.message if failure else None,
        timing=prorl_timing(result.timing, result.status),
        rollout_id=result.id,
        reward=result.reward,
        mask_reason=result.mask_reason,
    )


def prorl_timing(timing: Timing, status: TerminalStatus) -> ProRLTiming:
    counted = timing.init + timing.run + timing.eval
    return ProRLTiming(
        init_time=timing.init,
        run_time=timing.run,
        eval_time=timing.eval,
        others_time=max(0.0, timing.total - counted),
        counted_elapsed=counted,
        timeout_triggered=status == "timed_out",
    )


def prorl_messages(traj: Trajectory) -> list[ProRLMessage]:
    """The chat view with each assistant message's ids: ``token_ids`` (sampled),
    ``logprobs``, and ``input_ids`` (the prompt that turn was sampled from)."""
    turns = traj.turns
    prompts: list[list[int]] = []
    sequence: list[int] = []
    for sampled in turns:
        sequence = sequence + sampled.prompt_ids_delta
        prompts.append(sequence)
        sequence = sequence + sampled.output_ids
    assistant_at = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    # ProRL's conversations end with the last assistant message (none: no messages).
    messages = traj.messages[: assistant_at[-1] + 1] if assistant_at else []
    # The loop appends one assistant message per turn, after any the task opened with.
    first_turn_message = len(assistant_at) - len(turns)
    out = []
    for index, message in enumerate(messages):
        item: dict[str, JsonValue] = {"role": message.role, "content": _text(message)}
        extra = message.model_extra or {}
        for key in ("name", "tool_call_id"):
            if isinstance(extra.get(key), str):
                item[key] = extra[key]
        if message.role == "assistant":
            turn_index = assistant_at.index(index) - first_turn_message
            turn = turns[turn_index] if 0 <= turn_index < len(turns) else None
            # The calls the environment parsed from the turn; else (an assistant message
            # the task opened with, say) a chat API's structured calls on the message.
            calls = _flat(turn.tool_calls) if turn is not None and turn.tool_calls else _chat_api_calls(message)
            if calls:
                item["tool_calls"] = calls
            if traj.trainable and turn is not None:
                item["token_ids"] = list(turn.output_ids)
                item["input_ids"] = list(prompts[turn_index])
                item["logprobs"] = list(turn.logprobs)
            else:
                item["token_ids"] = item["input_ids"] = item["logprobs"] = None
        out.append(ProRLMessage.model_validate(item))
    return out


def _text(message: ChatMessage) -> str:
    """The message's text (a chat API's content parts joined)."""
    if isinstance(message.content, str):
        return message.content
    parts = message.content or []
    return "".join(text for part in parts if isinstance(text := part.get("text"), str))


def _flat(calls: list[ToolCall]) -> list[JsonValue]:
    """ProRL's flattened tool calls: ``[{"name", "arguments"}]``."""
    return [{"name": call.name, "arguments": call.arguments} for call in calls]


def _chat_api_calls(message: ChatMessage) -> list[JsonValue]:
    """A message's own chat-format ``tool_calls`` (``[{"id", "type", "function": {"name",
    "arguments"}}]``), flattened."""
    native = (message.model_extra or {}).get("tool_calls")
    flat: list[JsonValue] = []
    for call in native if isinstance(native, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
            if isinstance(name, str) and isinstance(arguments, (str, dict)):
                flat.append({"name": name, "arguments": arguments})
    return flat

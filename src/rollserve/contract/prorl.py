"""ProRL Agent Server's wire shapes, field for field (``rollserve serve --prorl``).

Its clients (NeMo Gym's ``prorl_agent``, ProRL's trainers) read these; see
``rollserve.api.prorl`` for where each field comes from. Fields ProRL's server leaves
out of a message are left out here too (they are only set where they apply), so
responses are rendered without unset fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from rollserve.contract.requests import JSONObject


# --- requests ------------------------------------------------------------------------------
class ProcessRequest(BaseModel):
    """``POST /process``: one rollout."""

    instance: JSONObject = Field(description="the task; ``data_source`` names the handler")
    sampling_params: JSONObject = Field(
        description="LiteLLM settings and agent config: temperature, top_p, top_k, seed, "
        "max_output_tokens (or max_tokens...), stop_token_ids, max_iterations; "
        "other keys are ignored"
    )
    job_id: str | None = Field(None, description="for /cancel; several rollouts may share one")


class CancelRequest(BaseModel):
    """``POST /cancel``."""

    job_id: str = Field(description="the job whose rollouts to cancel")


class LLMServerRequest(BaseModel):
    """``POST /add_llm_server``."""

    address: str = Field(
        description="http://host:8000/v1 or its root; KIND=URL for another kind of server (sglang=URL...)"
    )


# --- responses -----------------------------------------------------------------------------
class StatusReply(BaseModel):
    """What /start, /stop, /cancel and the LLM-server routes answer."""

    status: str = Field(description="what happened, in ProRL's words")


class ProRLStatus(BaseModel):
    """``GET /status``."""

    status: Literal["running"] = Field(description="always running (503 before /start)")
    pending_jobs: int = Field(description="/process calls waiting for their result")
    init_queue: int = Field(description="rollouts waiting for an INIT slot")
    run_queue: int = Field(description="rollouts waiting for a RUN slot")
    eval_queue: int = Field(description="rollouts waiting for an EVAL slot")
    active_init: int = Field(description="rollouts in INIT")
    active_run: int = Field(description="rollouts in RUN")
    active_eval: int = Field(description="rollouts in EVAL")
    total: int = Field(description="the six counts above, summed")
    llm_servers: list[str] = Field(description="each backend's URL (or name)")


class ProRLToolCall(BaseModel):
    """A tool call, flattened as ProRL's messages carry it."""

    name: str = Field(description="the tool called")
    arguments: JSONObject | str = Field(description="its arguments as parsed, or the raw text")


class ProRLMessage(BaseModel):
    """A chat message; an assistant message carries the ids of its turn."""

    role: str = Field(description="system | user | assistant | tool")
    content: str = Field(description="the message's text")
    name: str | None = Field(None, description="set where the message has one")
    tool_call_id: str | None = Field(None, description="set where the message has one")
    tool_calls: list[ProRLToolCall] | None = Field(
        None, description="an assistant message's calls, set when it made any"
    )
    token_ids: list[int] | None = Field(
        None, description="assistant: the ids the policy sampled, verbatim (null on a message-level backend)"
    )
    input_ids: list[int] | None = Field(None, description="assistant: the whole prompt that turn was sampled from")
    logprobs: list[float] | None = Field(None, description="assistant: of each sampled id")


class ProRLTiming(BaseModel):
    """Seconds, with ProRL's keys."""

    init_time: float = Field(description="seconds in INIT")
    run_time: float = Field(description="seconds in RUN")
    eval_time: float = Field(description="seconds in EVAL")
    others_time: float = Field(description="total minus the three stages (queueing...)")
    counted_elapsed: float = Field(description="the three stages summed")
    timeout_triggered: bool = Field(description="the rollout timed out")


class ProRLResult(BaseModel):
    """``POST /process``: ProRL's result dict."""

    instance_id: JsonValue = Field(description="from the instance")
    trajectory_id: JsonValue = Field(description="from the instance")
    job_id: str | None = Field(description="the job_id of the request (null when it sent none)")
    git_patch: str | None = Field(description="the evaluation's, if any")
    success: bool = Field(description="the rollout completed without failure")
    finish: bool = Field(description="the agent ended the episode itself")
    messages: list[ProRLMessage] = Field(description="up to the last assistant message")
    tools: list[JSONObject] = Field(description="the tool schemas the agent was shown")
    end_properly: bool = Field(description="its last turn was not cut by max_tokens or the context limit")
    resolved: bool = Field(description="the evaluation's resolved, else reward >= 1")
    critical_error: Literal["init", "run", "eval", "timeout"] | None = Field(
        description="timeout: timed out or cancelled; a stage: an infrastructure failure "
        "there; null otherwise (the agent's own failures are trained on)"
    )
    filter: bool = Field(description="do not train on it (rollserve's mask, or any critical_error)")
    error: str | None = Field(description="the failure message")
    timing: ProRLTiming
    rollout_id: str = Field(description="rollserve's rollout id")
    reward: float | None = Field(description="rollserve's reward")
    mask_reason: str | None = Field(description="rollserve's mask_reason")

"""What a trainer sends: a batch of tasks, each run ``n`` times as one group, and the
settings that shape each rollout (sampling, agent limits, timeouts).

Unknown fields are refused (``extra="forbid"``), so a misspelled setting is a 422
naming it, never silently ignored. A task's ``instance`` and ``metadata`` must be JSON
that every part of rollserve can hold (``validation.check_json``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
)

from rollserve.contract.judge import JudgeRequest
from rollserve.contract.validation import INT64_MAX, JSONInputError, check_json

JSONObject = dict[str, JsonValue]


def _storable(value: JSONObject) -> JSONObject:
    """Refuse JSON the store, the request hash and the chat template cannot hold; over
    HTTP the body was checked already, this covers every other way a request is built."""
    try:
        check_json(value)
    except JSONInputError as exc:
        raise ValueError(str(exc)) from None
    return value


StorableObject = Annotated[JSONObject, AfterValidator(_storable)]


class SamplingParams(BaseModel):
    """Sampling settings for one LLM call (one agent turn)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, le=10.0, description="softmax temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: int = Field(-1, ge=-1, le=2**31 - 1, description="-1 disables top-k")
    max_tokens: int = Field(512, ge=1, le=1_000_000, description="new tokens per turn")
    seed: int | None = Field(
        None, ge=0, le=2**63 - 1, description="the backend's sampling seed; sample i of a group samples with seed + i"
    )
    stop_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        default_factory=list, max_length=1024, description="ids that end a turn"
    )


class AgentLimits(BaseModel):
    """Per-request agent limits; unset fields take the handler's defaults."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = Field(None, ge=1, le=1000, description="assistant turns per episode")
    max_context_tokens: int | None = Field(
        None, ge=16, le=10_000_000, description="prompt plus sampled tokens of the whole episode"
    )


class Timeouts(BaseModel):
    """Seconds; unset fields take the handler's defaults."""

    model_config = ConfigDict(extra="forbid")

    init: float | None = Field(None, gt=0, le=86_400, description="the INIT stage (set-up)")
    run: float | None = Field(None, gt=0, le=86_400, description="the RUN stage (the agent loop)")
    eval: float | None = Field(None, gt=0, le=86_400, description="the EVAL stage (scoring)")
    total: float | None = Field(None, gt=0, le=7 * 86_400, description="the whole rollout, queueing included")
    run_margin: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="the agent's episode ends itself (ended_by "
        "time_limit, scored) this long before the RUN deadline, kept for what follows it "
        "(taking the patch, EVAL). Default: 10% of run, 10 s to 60 s; at most half the time "
        "RUN has",
    )


class TaskRequest(BaseModel):
    """One task: an instance of a data source, sampled ``n`` times (one group)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:/@+=-]+$",
        description="client-chosen id: resubmitting the same id returns the same group "
        "(idempotent retries); a different task under a known id is a 409",
    )
    data_source: str = Field(
        ..., min_length=1, max_length=100, description="the handler that runs it (math, code, swe, ...)"
    )
    instance: StorableObject = Field(..., description="the task, as its handler reads it")
    n: int = Field(
        1, ge=1, le=1024, description="samples of this task (one group): with oversample, the usable samples wanted"
    )
    oversample: int = Field(
        0,
        ge=0,
        le=1024,
        description="extra samples to start: the group starts n + oversample "
        "rollouts and, once n of them are usable (finished, not masked, with a reward), cancels "
        "the rest (status cancelled, masked; their LLM calls aborted and sandboxes closed). "
        "0: no early stop",
    )
    filter_zero_variance: bool = Field(
        False,
        description="DAPO's dynamic sampling: flag the group not usable (reason "
        "zero_variance) when the rewards of its n used samples all agree (no advantage "
        "signal). Needs n >= 2",
    )
    sampling: SamplingParams | None = Field(None, description="on top of the batch's")
    agent: AgentLimits | None = Field(None, description="on top of the batch's")
    timeouts: Timeouts | None = Field(None, description="on top of the batch's")
    metadata: StorableObject = Field(default_factory=dict, description="returned as is in every result")
    judge: JudgeRequest | None = Field(
        None,
        description="a judge reward by a rubric, on top of the family's outcome "
        "(docs/judges.md); the batch's when unset",
    )

    @field_validator("filter_zero_variance")
    @classmethod
    def _filter_needs_a_group(cls, value: bool, info: ValidationInfo) -> bool:
        n = info.data.get("n")
        if value and isinstance(n, int) and n < 2:
            raise ValueError(f"needs n >= 2 (a group of {n} always has zero variance)")
        return value


class SubmitRequest(BaseModel):
    """``POST /v1/rollouts``: a batch, admitted whole or refused whole."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskRequest] = Field(
        ..., min_length=1, max_length=10_000, description="the tasks, each run n times as one group"
    )
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="for every task (a task's own fields win)"
    )
    agent: AgentLimits = Field(default_factory=AgentLimits, description="for every task (a task's own fields win)")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="for every task (a task's own fields win)")
    judge: JudgeRequest | None = Field(
        None, description="a judge reward for every task without its own (docs/judges.md)"
    )


MAX_WAIT = 600.0  # seconds: the longest long-poll


class RunRequest(BaseModel):
    """``POST /v1/rollouts:run``: one task, answered with its results (for scripts)."""

    model_config = ConfigDict(extra="forbid")

    task: TaskRequest
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    agent: AgentLimits = Field(default_factory=AgentLimits)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    wait: float = Field(
        MAX_WAIT,
        gt=0,
        le=MAX_WAIT,
        description="seconds to wait for the results (what is unfinished then comes back without its result)",
    )

    def batch(self) -> SubmitRequest:
        """The same task as a batch of one."""
        return SubmitRequest(tasks=[self.task], sampling=self.sampling, agent=self.agent, timeouts=self.timeouts)


class PauseRequest(BaseModel):
    """``POST /v1/llm/pause``: hold generation around a weight update."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["finish", "abort"] = Field(
        "finish",
        description="finish: calls in flight complete first; abort: they are aborted and sent again after resume",
    )
    timeout: float = Field(
        MAX_WAIT,
        ge=0,
        le=3600,
        description="seconds to wait for calls in flight (finish); past it the answer says drained: false",
    )
    forward: bool | None = Field(
        None, description="also pause the servers that support it (default: the server's setting)"
    )


class ResumeRequest(BaseModel):
    """``POST /v1/llm/resume``: let generation go again."""

    model_config = ConfigDict(extra="forbid")

    policy_version: int | None = Field(
        None,
        ge=0,
        le=INT64_MAX,
        description="stamped on every turn sampled from now on; "
        "below the version in force: a 409, unless "
        "allow_lower_version",
    )
    allow_lower_version: bool = Field(
        False,
        description="accept a policy_version below the one in force (a trainer "
        "restarting from an older checkpoint); otherwise such a resume is "
        "refused and generation stays paused",
    )


class Weights(BaseModel):
    """New weights: a LoRA adapter (``kind`` lora, its ``name`` and folder) to load into
    every vLLM server in place, or every weight of the served model from a folder
    (``kind`` full: vLLM dev mode, SGLang)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["lora", "full"] = Field(description="lora | full")
    name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:@+=/-]+$",
        validate_default=True,
        description="lora: the adapter's name, which every later request names as its model",
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="the folder (a PEFT adapter, or a safetensors checkpoint), as the inference servers see it",
    )

    @field_validator("name")
    @classmethod
    def _named_if_lora(cls, name: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")
        if kind == "lora" and name is None:
            raise ValueError("a LoRA adapter needs a name (requests name it as their model)")
        if kind == "full" and name is not None:
            raise ValueError("full weights have no name (requests name the served model)")
        return name


class WeightsRequest(BaseModel):
    """``POST /v1/llm/weights``: load new weights into every token-level backend (only
    while generation is paused with nothing in flight)."""

    model_config = ConfigDict(extra="forbid")

    weights: Weights = Field(description="a LoRA adapter or full weights")
    policy_version: int | None = Field(
        None,
        ge=0,
        le=INT64_MAX,
        description="the version these weights are (recorded by servers that keep one: SGLang's weight_version)",
    )
    timeout: float = Field(600.0, gt=0, le=3600, description="seconds each server may take")

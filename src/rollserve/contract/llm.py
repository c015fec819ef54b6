"""What the inference routes answer (``/v1/llm/...``): backends, the router's state,
pause and resume around a weight update."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class BackendInfo(BaseModel):
    """An inference backend as registered. A kind may add facts of its own (vLLM's
    ``endpoint``, an embedded model's ``n_ctx``)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    name: str = Field(description="unique among the server's backends")
    kind: str = Field(description="vllm | sglang | llamacpp | openai | embedded ...")
    url: str | None = Field(None, description="the server's root URL (none in-process)")
    model: str | None = Field(None, description="the model it serves, when known")
    trainable: bool = Field(
        description="samples from token ids and returns them with logprobs (false: a message-level chat API)"
    )
    outstanding: int = Field(0, description="requests in flight")


class BackendState(BackendInfo):
    """A backend as the router sees it: health, load, speed."""

    healthy: bool = Field(description="takes new requests (health probes pass)")
    draining: bool = Field(description="finishes what is in flight, takes nothing new")
    sessions: int = Field(description="trajectories pinned to it now")
    assigned: int = Field(description="trajectories ever pinned to it")
    weight: float = Field(description="its share of new trajectories, relative to the others")
    calls: int = Field(description="calls sent to it")
    failures: int = Field(description="calls that failed on it")
    unit_cost_ms: float | None = Field(
        description="milliseconds of latency per request in flight (EWMA); null before its first call"
    )
    last_error: str | None = Field(description="its last failure, if any")


class LastWeightLoad(BaseModel):
    """The last weight load that took on at least one backend (kept across a restart)."""

    kind: Literal["lora", "full"] = Field(description="what was loaded")
    name: str | None = Field(description="the adapter's name (LoRA only)")
    path: str = Field(description="the folder the servers read it from")
    policy_version: int | None = Field(description="the version the load request named")
    failed: list[str] = Field(description="backends that did not load it")
    loaded_at: float = Field(description="when it ended (Unix time, seconds)")


class RouterStatus(BaseModel):
    """The router: pause state, the policy version stamped on new turns, call counts."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    paused: bool = Field(description="new LLM calls are held")
    pause_mode: Literal["finish", "abort"] | None = Field(
        description="how the pause treats calls in flight (null when not paused)"
    )
    policy_version: int | None = Field(description="stamped on turns sampled from now on")
    policy: str = Field(description="how a new trajectory picks its backend")
    lora: str | None = Field(
        None, description="the LoRA adapter requests name (null: the base model); kept across a restart"
    )
    last_load: LastWeightLoad | None = Field(
        None, description="the last weight load that took (null: none since the state dir's store was made)"
    )
    in_flight: int = Field(description="calls in flight")
    health_checks: bool = Field(description="the health probes are running")
    calls: int = Field(description="calls sent since start")
    retries: int = Field(description="calls sent again after a failure")
    aborted_by_pause: int = Field(description="calls aborted by a pause (abort mode)")
    failed: int = Field(description="calls that failed for good")
    moves: int = Field(description="trajectories moved off a backend that went away")


class BackendList(BaseModel):
    """``GET /v1/llm/backends``."""

    backends: list[BackendState] = Field(description="every backend, as the router sees it")
    router: RouterStatus


class BackendAdded(BaseModel):
    """``POST /v1/llm/backends``."""

    backend: BackendInfo


class BackendRemoved(BaseModel):
    """``DELETE /v1/llm/backends/{name}``."""

    removed: str = Field(description="the name of the backend removed")


class BackendDrained(BaseModel):
    """``POST /v1/llm/backends/{name}/drain``."""

    backend: BackendState
    drained: bool = Field(description="nothing is left in flight on it")


class BackendUndrained(BaseModel):
    """``POST /v1/llm/backends/{name}/undrain``."""

    backend: BackendState


class Paused(BaseModel):
    """``POST /v1/llm/pause``."""

    paused: bool = Field(description="generation is held")
    mode: Literal["finish", "abort"] = Field(description="the pause's mode")
    aborted: int = Field(description="calls aborted (abort mode); sent again after resume")
    drained: bool = Field(description="nothing is in flight any more")
    in_flight: int = Field(description="calls still in flight")
    policy_version: int | None = Field(description="the policy version of turns sampled from now on")
    forwarded: dict[str, str] = Field(description="per backend paused on its server: the outcome")


class Resumed(BaseModel):
    """``POST /v1/llm/resume``."""

    paused: bool = Field(description="generation is held (false after a resume)")
    policy_version: int | None = Field(description="the policy version of turns sampled from now on")
    forwarded: dict[str, str] = Field(description="per backend resumed on its server: the outcome")


class WeightsLoaded(BaseModel):
    """``POST /v1/llm/weights``."""

    ok: bool = Field(description="every backend loaded the weights")
    kind: Literal["lora", "full"] = Field(description="what was loaded")
    outcomes: dict[str, str] = Field(description="per backend: ok, or the error")
    models: dict[str, str | None] = Field(
        description="per backend: the model its later requests name (the adapter after a LoRA load)"
    )
    policy_version: int | None = Field(
        description="the policy version stamped on turns now (a resume sets the new one)"
    )

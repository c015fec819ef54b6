"""A Harbor task's ``task.toml``, read with tomllib and checked with pydantic (the
format as Harbor 0.26 defines it; its code is read, not imported), and what of it this
server cannot honour.

Every section is ``extra="forbid"``: a key we do not know is a refusal naming it, never
a silent difference. The fields that parse but cannot be honoured (``refusals``) are
refused at submit, each naming its field (``task.toml: verifier.environment_mode``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Harbor's schema versions (``version`` was the key before 1.1); anything else is refused.
SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
NetworkMode = Literal["no-network", "public", "allowlist"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Healthcheck(_Section):
    command: str = Field(min_length=1)
    interval_sec: float = Field(5.0, gt=0, le=60)
    timeout_sec: float = Field(30.0, gt=0, le=600)
    start_period_sec: float = Field(0.0, ge=0, le=600)
    start_interval_sec: float = Field(5.0, gt=0, le=60)
    retries: int = Field(3, ge=0, le=100)


class Phase(_Section):
    """What ``[agent]`` and ``[verifier]`` share: their user and network policy."""

    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None


class Agent(Phase):
    timeout_sec: float | None = Field(None, gt=0)


class Verifier(Phase):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None
    collect: list[dict[str, Any]] = Field(default_factory=list)


class Solution(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class Environment(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    gpus: int | None = Field(None, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None
    workdir: str | None = None
    network_mode: NetworkMode = "public"  # Harbor's default
    allowed_hosts: list[str] | None = None
    allow_internet: bool | None = None  # deprecated in Harbor for network_mode

    @field_validator("os", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        """Harbor's older ``memory``/``storage`` strings ("2G", "512M")."""
        if isinstance(data, dict):
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if old in data:
                    data = {**data, new: _megabytes(data.pop(old)) if new not in data else data[new]}
        return data

    @property
    def public(self) -> bool:
        """Whether the task asks for the network (Harbor's default: public)."""
        if self.allow_internet is not None:
            return self.allow_internet
        return self.network_mode != "no-network"


def _megabytes(size: Any) -> Any:
    if not isinstance(size, str):
        return size
    text = size.strip().upper()
    scale = {"G": 1024, "M": 1, "K": 1 / 1024}.get(text[-1:])
    if scale is None:
        raise ValueError(f"size {size!r}: expected e.g. '2G' or '512M'")
    try:
        return int(float(text[:-1]) * scale)
    except (ValueError, OverflowError):  # "xG"; "1e400G", "infG": no integer
        raise ValueError(f"size {size!r}: expected a finite number of megabytes, e.g. '2G' or '512M'") from None


class TaskConfig(_Section):
    schema_version: str = "1.4"
    task: dict[str, Any] | None = None  # Harbor's package info: name, authors...
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: Verifier = Field(default_factory=Verifier)
    agent: Agent = Field(default_factory=Agent)
    environment: Environment = Field(default_factory=Environment)
    solution: Solution = Field(default_factory=Solution)
    source: str | None = None
    multi_step_reward_strategy: str | None = None
    steps: list[dict[str, Any]] | None = None
    artifacts: list[Any] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _version_renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data and "schema_version" not in data:
            data = dict(data)
            data["schema_version"] = data.pop("version")
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: str) -> str:
        if version not in SCHEMA_VERSIONS:
            raise ValueError(f"unknown schema_version {version!r} (known: {', '.join(SCHEMA_VERSIONS)})")
        return version


def refusals(
    config: TaskConfig, *, images: bool, cpus: int, host_images: tuple[str, ...] = ()
) -> tuple[str, str] | None:
    """The first field of ``config`` this server cannot honour: (field, why); None if none.
    ``images``: the runtime in force runs images (docker/podman/apptainer);
    ``host_images``: images the operator declares the host's system stands in for."""
    for check in (_unsupported, _phases, _env_values):
        found = check(config)
        if found is not None:
            return found
    env = config.environment
    if env.cpus is not None and env.cpus > cpus:
        return "environment.cpus", f"{env.cpus:g} asked, this server has {cpus}"
    if not images and env.docker_image is not None and env.docker_image not in host_images:
        return (
            "environment.docker_image",
            "an image needs an image runtime (docker, podman, "
            "apptainer); this server runs tasks on the host's system (bubblewrap), which "
            "stands in only for the images of its harbor option host_images",
        )
    return None


def _unsupported(config: TaskConfig) -> tuple[str, str] | None:
    env, verifier = config.environment, config.verifier
    checks: list[tuple[bool, str, str]] = [
        (bool(config.steps), "steps", "multi-step tasks are not supported"),
        (bool(config.artifacts), "artifacts", "artifact collection is not supported"),
        (env.os == "windows", "environment.os", "Windows tasks are not supported"),
        (bool(env.gpus), "environment.gpus", "GPUs are not supported"),
        (bool(env.gpu_types), "environment.gpu_types", "GPUs are not supported"),
        (env.tpu is not None, "environment.tpu", "TPUs are not supported"),
        (bool(env.mcp_servers), "environment.mcp_servers", "MCP servers are not supported"),
        (env.skills_dir is not None, "environment.skills_dir", "skills are not supported"),
        (
            env.network_mode == "allowlist" or bool(env.allowed_hosts),
            "environment.allowed_hosts",
            "network allowlists are not supported (sandboxes have no network)",
        ),
        (
            verifier.environment_mode == "separate" or verifier.environment is not None,
            "verifier.environment_mode",
            "a separate verifier environment is not supported: the verifier runs in the agent's environment",
        ),
        (bool(verifier.collect), "verifier.collect", "collecting from services is not supported"),
    ]
    for refused, name, why in checks:
        if refused:
            return name, why
    return None


def _phases(config: TaskConfig) -> tuple[str, str] | None:
    for name, phase in (("agent", config.agent), ("verifier", config.verifier)):
        if phase.user is not None:
            return (f"{name}.user", "sandboxes run as one unprivileged user: a task cannot choose its user")
        if phase.network_mode == "allowlist" or phase.allowed_hosts:
            return f"{name}.allowed_hosts", "network allowlists are not supported"
    if config.agent.timeout_sec is not None and not math.isfinite(config.agent.timeout_sec):
        return "agent.timeout_sec", "must be finite"
    return None


def _env_values(config: TaskConfig) -> tuple[str, str] | None:
    """Harbor fills ``${VAR}`` in env values from its host's environment: never here (a
    server's environment is not a task's to read)."""
    for section, values in (
        ("environment.env", config.environment.env),
        ("verifier.env", config.verifier.env),
        ("solution.env", config.solution.env),
    ):
        for key, value in values.items():
            if "${" in value:
                return (f"{section}.{key}", "values taken from the server's environment (${...}) are not supported")
    return None

"""The verl agent loop's parts that need no verl: dataset rows, one bounded rollout, and
a result as verl's prompt/response fields (used by ``rollserve.integrations.verl``).

A verl dataset row (a parquet row of ``RLHFDataset``) carries its rollserve task in two
columns verl already has: ``data_source`` (the rollserve handler: ``math``, ``code``, ...)
and ``extra_info["rollserve"]``: the task's ``instance`` and optional ``sampling``,
``agent``, ``timeouts``, ``metadata``, as an object or (better in parquet: Arrow merges
the objects of all rows into one struct and fills every missing key with null) as a JSON
string. ``verl_row`` builds such a row and checks its task. The row's ``prompt`` column is
only for verl (its length filter, its logs): rollserve renders the prompt from the
instance.

``to_verl`` splits a result as ``tensors.to_sample`` does (the first prompt, then every
later token with rollserve's loss mask and the backend's logprobs) and fits it to verl's
``prompt_length``/``response_length``. A sample verl must not train on gets a response
mask of all 0 and a reward of 0.0 (verl 0.9 needs a number for every sample of a
batch): masked by rollserve (``tensors.trainable`` false), not finished within the loop's
timeout, or longer than verl's limits (cut to fit, and masked: its reward was earned by
tokens verl would not see).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx
from pydantic import JsonValue, ValidationError

from rollserve.client import AsyncClient, RollserveError
from rollserve.contract import AgentLimits, RolloutResult, SamplingParams, TaskRequest, Timeouts
from rollserve.integrations.tensors import info, to_sample

__all__ = [
    "LoopSettings",
    "VerlOutput",
    "VerlTaskError",
    "register_servers",
    "run_one",
    "task_from_row",
    "to_verl",
    "verl_row",
    "verl_servers",
]

TASK_KEY = "rollserve"  # extra_info[TASK_KEY]: the task
TASK_FIELDS = ("instance", "sampling", "agent", "timeouts", "metadata")
# The sampling verl passes to run() (its rollout config, or val_kwargs when validating).
VERL_SAMPLING = ("temperature", "top_p", "top_k")


class VerlTaskError(ValueError):
    """A row does not carry a valid rollserve task (the message names the field)."""


def _fields(value: object) -> dict[str, object]:
    """``extra_info["rollserve"]`` as a dict: an object or a JSON string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise VerlTaskError(f"extra_info.{TASK_KEY}: not valid JSON ({exc})") from None
    if not isinstance(value, Mapping):
        raise VerlTaskError(
            f"extra_info.{TASK_KEY}: must be an object or a JSON string of one, got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(TASK_FIELDS))
    if unknown:
        raise VerlTaskError(
            f"extra_info.{TASK_KEY}.{unknown[0]}: not a task field here (allowed: "
            f"{', '.join(TASK_FIELDS)}; data_source is the row's column, and a "
            "trainer's task never carries an id or n)"
        )
    return {key: item for key, item in value.items() if item is not None}


def task_from_row(data_source: object, extra_info: object) -> TaskRequest:
    """The task of a verl row (its ``data_source`` and ``extra_info`` columns), n=1, no id:
    a client id would make the server answer with that group's old samples."""
    if not isinstance(data_source, str) or not data_source:
        raise VerlTaskError(f"data_source: the row's rollserve data source, a non-empty string (got {data_source!r})")
    if not isinstance(extra_info, Mapping) or extra_info.get(TASK_KEY) is None:
        raise VerlTaskError(
            f"extra_info.{TASK_KEY}: missing (build rows with rollserve.integrations.verl_rows.verl_row)"
        )
    fields = _fields(extra_info[TASK_KEY])
    if isinstance(fields.get("instance"), str):
        try:
            fields["instance"] = json.loads(str(fields["instance"]))
        except ValueError as exc:
            raise VerlTaskError(f"extra_info.{TASK_KEY}.instance: not valid JSON ({exc})") from None
    try:
        return TaskRequest.model_validate({**fields, "data_source": data_source, "n": 1})
    except ValidationError as exc:
        raise VerlTaskError(f"extra_info.{TASK_KEY}: invalid task: {exc}") from None


def verl_row(
    task: Mapping[str, object], index: int, prompt: str | None = None, agent_name: str = "rollserve"
) -> dict[str, JsonValue]:
    """A verl dataset row for ``task`` (``data_source``, ``instance`` and the optional
    ``sampling``, ``agent``, ``timeouts``, ``metadata``), checked now so that a bad row
    fails while the dataset is built. ``prompt``: the text verl shows and length-filters
    (default: the instance as JSON)."""
    fields = {key: task[key] for key in TASK_FIELDS if task.get(key) is not None}
    encoded = json.dumps(fields, sort_keys=True)
    checked = task_from_row(task.get("data_source"), {TASK_KEY: encoded})
    text = prompt if prompt is not None else json.dumps(checked.instance, sort_keys=True)
    return {
        "data_source": checked.data_source,
        "prompt": [{"role": "user", "content": text}],
        "agent_name": agent_name,
        "extra_info": {"index": index, TASK_KEY: encoded},
    }


@dataclass(frozen=True)
class LoopSettings:
    """The agent loop's configuration (its entry in verl's agent loop config file)."""

    url: str
    timeout: float = 3600.0  # seconds for one run(), every attempt together
    masked_retries: int = 1  # fresh samples asked for after a masked one
    # "registered": rollserve's backends as they are; "verl": verl's inference servers
    # are registered in rollserve first (register_servers), then sampled from.
    backends: Literal["registered", "verl"] = "registered"
    sampling: SamplingParams | None = None  # under verl's temperature/top_p/top_k
    agent: AgentLimits | None = None
    timeouts: Timeouts | None = None

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("url: the rollserve server's URL (the loop's `url` or ROLLSERVE_URL)")
        if not 0 < self.timeout <= 7 * 86_400:
            raise ValueError(f"timeout: seconds in (0, 604800], got {self.timeout}")
        if not 0 <= self.masked_retries <= 10:
            raise ValueError(f"masked_retries: 0 to 10, got {self.masked_retries}")
        if self.backends not in ("registered", "verl"):
            raise ValueError(f"backends: registered or verl, got {self.backends!r}")


def batch_sampling(settings: LoopSettings, verl_sampling: Mapping[str, object]) -> SamplingParams:
    """The batch-level sampling: the loop's, with verl's temperature, top_p and top_k on
    top (a row's own ``sampling`` still wins, as the server merges them)."""
    penalty = verl_sampling.get("repetition_penalty", 1.0)
    if penalty not in (None, 1.0):
        raise ValueError(f"sampling_params.repetition_penalty: rollserve has none; got {penalty}")
    base = settings.sampling.model_dump(exclude_unset=True) if settings.sampling else {}
    given = {key: verl_sampling[key] for key in VERL_SAMPLING if verl_sampling.get(key) is not None}
    return SamplingParams.model_validate({**base, **given})


def fit_limits(task: TaskRequest, settings: LoopSettings, budget: int) -> TaskRequest:
    """``task`` with ``agent.max_context_tokens`` at most ``budget`` (verl's prompt_length
    + response_length), so the episode ends within what verl can hold."""
    agent = task.agent or AgentLimits()
    given = [
        limits.max_context_tokens
        for limits in (task.agent, settings.agent)
        if limits is not None and limits.max_context_tokens is not None
    ]
    fields = {**agent.model_dump(exclude_unset=True), "max_context_tokens": min([*given, budget])}
    return task.model_copy(update={"agent": AgentLimits.model_validate(fields)})


# verl's rollout engines that rollserve has a backend kind for.
SERVER_KINDS = {"vllm": "vllm", "sglang": "sglang"}


async def verl_servers(server_manager: object, verl_version: str) -> list[str]:
    """The addresses (``host:port``) of verl's inference servers, from the load balancer
    that the agent loop's ``server_manager`` (verl's ``LLMServerClient``) holds.

    verl 0.9.1 gives an agent loop no public way to list them: the balancer (a Ray
    actor whose ``get_all_servers`` is public) sits on the client's private
    ``_load_balancer``, and the public ``LLMServerManager.get_addresses`` is not
    reachable from a loop. So it is read here only, guarded: a verl that keeps it
    elsewhere is a ValueError naming that verl's version, not an AttributeError.
    """
    balancer = getattr(server_manager, "_load_balancer", None)
    listing = getattr(getattr(balancer, "get_all_servers", None), "remote", None)
    if not callable(listing):
        raise ValueError(
            f"backends: verl: verl {verl_version}'s {type(server_manager).__name__} has no "
            "load balancer to list its servers from (rollserve reads "
            "LLMServerClient._load_balancer.get_all_servers, as verl 0.9.1 has it); "
            "register the servers in rollserve and use backends: registered"
        )
    return [str(address) for address in await listing()]


async def register_servers(client: AsyncClient, addresses: Sequence[str], engine: str) -> list[str]:
    """Register verl's inference servers (``host:port``, as verl's load balancer lists
    them) as rollserve backends named ``verl-<host>-<port>``, those not registered yet
    (by URL); returns the names added. ``engine``: verl's ``rollout.name``."""
    kind = SERVER_KINDS.get(engine)
    if kind is None:
        raise ValueError(
            f"actor_rollout_ref.rollout.name: rollserve has no backend kind for "
            f"verl's {engine!r} servers (it has {', '.join(SERVER_KINDS)})"
        )
    known = {backend.url.rstrip("/") for backend in (await client.list_backends()).backends if backend.url}
    added: list[str] = []
    for address in addresses:
        url = f"http://{address}"
        if url in known:
            continue
        name = "verl-" + re.sub(r"[^A-Za-z0-9._-]+", "-", address).strip("-")
        try:
            await client.add_backend({"url": url, "kind": kind, "name": name})
        except RollserveError as exc:
            if exc.status != 409:  # 409: another sample registered it just now
                raise
            continue
        added.append(name)
    return added


@dataclass(frozen=True)
class Attempts:
    """What ``run_one`` got: the last result (None: not finished within the timeout)."""

    result: RolloutResult | None
    count: int
    group_ids: list[str]


async def _cancel(client: AsyncClient, group_id: str) -> None:
    """Stop a group the loop gave up on (best effort: the outcome matters more)."""
    try:
        await client.cancel_group(group_id)
    except (RollserveError, httpx.HTTPError, OSError):
        pass


async def run_one(client: AsyncClient, task: TaskRequest, sampling: SamplingParams, settings: LoopSettings) -> Attempts:
    """Submit ``task`` (n=1) and wait for its result, at most ``settings.timeout`` seconds
    for every attempt together; a masked result is asked again, fresh, up to
    ``masked_retries`` times. A group not finished in time is cancelled (and so is one
    whose waiting is cancelled: nothing verl gave up on keeps running)."""
    deadline = time.monotonic() + settings.timeout
    result: RolloutResult | None = None
    group_ids: list[str] = []
    while len(group_ids) <= settings.masked_retries:
        accepted = await client.submit([task], sampling=sampling, agent=settings.agent, timeouts=settings.timeouts)
        group_id = accepted.groups[0].group_id
        group_ids.append(group_id)
        try:
            view = await client.wait_group(group_id, timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            await asyncio.shield(_cancel(client, group_id))
            raise
        results = [member.result for member in view.rollouts if member.result is not None]
        if not view.done or not results:
            await _cancel(client, group_id)
            return Attempts(None, len(group_ids), group_ids)
        result = results[0]
        if not to_sample(result, 0).masked or time.monotonic() >= deadline:
            break
    return Attempts(result, len(group_ids), group_ids)


@dataclass(frozen=True)
class VerlOutput:
    """The fields of verl's ``AgentLoopOutput`` for one sample, and what to log."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: float
    num_turns: int
    masked: bool
    reason: str | None  # why masked: rollserve's mask reason, timeout, over_length
    metrics: dict[str, float]  # verl's AgentLoopMetrics fields
    info: dict[str, JsonValue]  # tensors.info + timing + attempts


def _metrics(result: RolloutResult | None) -> dict[str, float]:
    """rollserve's timings as verl's agent loop metrics: ``generate_sequences`` the LLM
    calls (else the RUN stage), ``tool_calls`` the tools, ``compute_score`` EVAL."""
    if result is None:
        return {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0}
    extra = result.timing.model_extra or {}
    return {
        "generate_sequences": float(extra.get("llm", result.timing.run)),
        "tool_calls": float(extra.get("tools", 0.0)),
        "compute_score": result.timing.eval,
    }


def to_verl(attempts: Attempts, prompt_length: int, response_length: int, filler_id: int) -> VerlOutput:
    """One result as verl's output fields (see the module's docstring)."""
    result = attempts.result
    if result is None:
        return VerlOutput(
            [filler_id],
            [filler_id],
            [0],
            [0.0],
            0.0,
            0,
            True,
            "timeout",
            _metrics(None),
            {"attempts": attempts.count, "group_ids": list(attempts.group_ids)},
        )
    sample = to_sample(result, filler_id)
    reason = (result.mask_reason or result.status) if sample.masked else None
    prompt_ids, response_ids = sample.prompt_ids, sample.completion_ids
    mask, logprobs = sample.env_mask, sample.logprobs
    if len(prompt_ids) > prompt_length or len(response_ids) > response_length:
        reason = reason or "over_length"
        prompt_ids = prompt_ids[-prompt_length:]
        response_ids, logprobs = response_ids[:response_length], logprobs[:response_length]
        mask = [0] * len(response_ids)
    masked = reason is not None
    details: dict[str, JsonValue] = {
        **info(result),
        "attempts": attempts.count,
        "group_ids": list(attempts.group_ids),
        "reason": reason,
        "timing": result.timing.model_dump(mode="json"),
    }
    return VerlOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=0.0 if masked or sample.reward is None else sample.reward,
        num_turns=len(result.trajectory.messages),
        masked=masked,
        reason=reason,
        metrics=_metrics(result),
        info=details,
    )

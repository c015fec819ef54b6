"""TRL's ``GRPOTrainer(rollout_func=...)`` on rollserve (written against TRL 1.16).

What TRL 1.16 does (``trl/trainer/grpo_trainer.py``): it calls ``rollout_func(prompts,
trainer)`` with only the ``prompt`` column of this process's slice of the generation
batch, each prompt already repeated ``num_generations`` times in a row by its sampler
(a group may straddle two processes); it wants one completion per prompt, in order
(``prompt_ids``, ``completion_ids``, ``logprobs``; ``env_mask`` is optional), and hands
every other key to the reward functions as a column. A reward of None is NaN there: a
row on which every reward function says None is left out of its group's mean and std,
and its advantage is 0.

Because TRL passes only the prompt, each row's task travels in it: build the column
with ``task_prompt(row)`` from the row's ``data_source`` and ``instance`` (and optional
``sampling``, ``agent``, ``timeouts``, ``metadata``) columns::

    dataset = dataset.map(lambda row: {"prompt": task_prompt(row)})
    trainer = GRPOTrainer(model=..., args=GRPOConfig(num_generations=8, ...),
                          train_dataset=dataset, reward_funcs=[rollserve_reward],
                          rollout_func=rollout_func("http://127.0.0.1:8000"))

A masked rollout (``tensors.to_sample``) gets ``env_mask`` all 0, so none of its
tokens enters the loss, and ``rollserve_reward`` None, so TRL leaves it out of its
group's baseline. With ``oversample``/``filter_zero_variance`` each group still gives
exactly its prompts' rows: its used samples, or masked rows when the server flags it
``zero_variance`` (or ``too_few_usable`` while over-sampling); see
``rollserve.integrations.groups``. A result of several token sequences (a harness
behind the gateway rewrote its history) has no one prompt/completion pair: the rollout
function raises ``MultiSequenceError`` naming it. Only ``rollserve.client`` and
``rollserve.contract`` are imported;
TRL is not needed to import this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from pydantic import JsonValue, ValidationError

from rollserve.client import Client
from rollserve.contract import AgentLimits, SamplingParams, TaskRequest, Timeouts
from rollserve.integrations.groups import (
    BatchCounts,
    BatchSettings,
    IncompleteGroupError,
    run_batch,
)
from rollserve.integrations.tensors import MultiSequenceError, Sample, to_sample

__all__ = [
    "BatchCounts",
    "IncompleteGroupError",
    "MultiSequenceError",
    "RolloutFunction",
    "TaskPromptError",
    "rollout_func",
    "rollserve_reward",
    "task_prompt",
]

PROMPT_TAG = "rollserve_task"
TASK_COLUMNS = (
    "data_source",
    "instance",
    "sampling",
    "agent",
    "timeouts",
    "metadata",
    "oversample",
    "filter_zero_variance",
)

RolloutOutput = dict[
    str,
    list[list[int]]
    | list[list[float]]
    | list[float | None]
    | list[bool]
    | list[str]
    | list[dict[str, JsonValue]]
    | list[dict[str, float] | None],
]


class TaskPromptError(ValueError):
    """A prompt TRL passed is not a task built by ``task_prompt``, or its task is invalid."""


class _Module(Protocol):
    training: bool


class _Accelerator(Protocol):
    process_index: int


class Trainer(Protocol):
    """What the rollout function reads of TRL's ``GRPOTrainer``."""

    num_generations: int
    num_generations_eval: int
    eos_token_ids: list[int]

    @property
    def model(self) -> _Module: ...

    @property
    def accelerator(self) -> _Accelerator: ...


def _column(row: Mapping[str, object], key: str) -> object:
    """A task column as given: an object, or an object as a JSON string (an Arrow table
    turns dicts of different keys into one struct with null-filled keys; a JSON string
    keeps each as written)."""
    value = row[key]
    if key == "data_source" or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise TaskPromptError(f"{key}: not valid JSON ({exc})") from None


def task_prompt(row: Mapping[str, object]) -> str:
    """The ``prompt`` value carrying a row's task: ``data_source`` and ``instance``
    (an object or a JSON string), optional ``sampling``, ``agent``, ``timeouts``,
    ``metadata``, ``oversample``, ``filter_zero_variance`` (these two override the
    rollout function's). Checked here (as a group of 2), so a bad row fails while the
    dataset is built."""
    fields = {key: _column(row, key) for key in TASK_COLUMNS if row.get(key) is not None}
    task = _task(json.dumps({PROMPT_TAG: fields}, sort_keys=True), n=2)
    return json.dumps({PROMPT_TAG: task.model_dump(mode="json", exclude_unset=True, exclude={"n"})}, sort_keys=True)


def _task(prompt: object, n: int, defaults: Mapping[str, JsonValue] | None = None) -> TaskRequest:
    """The task a prompt carries, to be sampled ``n`` times, on top of ``defaults`` (the
    rollout function's ``oversample``/``filter_zero_variance``). No ``id``: a client id
    makes a resubmission return the old group, and a trainer must get fresh samples. A
    part of one sample (a group straddling processes) cannot be filtered: its filter is
    off."""
    try:
        fields = json.loads(prompt)[PROMPT_TAG] if isinstance(prompt, str) else None
    except (ValueError, TypeError, KeyError):
        fields = None
    if not isinstance(fields, dict):
        raise TaskPromptError(
            "the prompt is not a rollserve task; build the prompt column "
            "with rollserve.integrations.trl.task_prompt(row)"
        )
    if "id" in fields:
        raise TaskPromptError(
            "id: a trainer's task must not carry a client id (the server "
            "would answer a known id with that group's old samples)"
        )
    merged: dict[str, object] = {**(defaults or {}), **fields, "n": n}
    if n < 2:
        merged["filter_zero_variance"] = False
    try:
        return TaskRequest.model_validate(merged)
    except ValidationError as exc:
        raise TaskPromptError(f"the prompt's task is invalid: {exc}") from None


def _layout(prompts: Sequence[object], group_size: int, offset: int) -> list[tuple[int, int]]:
    """(start, stop) of each run of this slice that belongs to one TRL group: global
    position ``offset + i`` is in group ``(offset + i) // group_size``."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or (offset + i) // group_size != (offset + start) // group_size:
            if any(prompts[j] != prompts[start] for j in range(start, i)):
                raise TaskPromptError(
                    f"prompts {start}..{i - 1} should be one group of num_generations="
                    f"{group_size} (TRL repeats each prompt that many times) but differ"
                )
            runs.append((start, i))
            start = i
    return runs


class RolloutFunction:
    """The ``rollout_func`` ``rollout_func(...)`` makes; ``last_counts`` holds the last
    batch's ``BatchCounts`` (groups usable/filtered/too few usable/masked whole; samples
    started, finished, usable, used, cancelled, masked, filtered; rows, rows trained),
    and ``on_batch`` (when given) is called with them after each batch."""

    def __init__(
        self,
        client: Client,
        settings: BatchSettings,
        timeout: float,
        filler_id: int | None,
        defaults: dict[str, JsonValue],
        on_batch: Callable[[BatchCounts], None] | None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.timeout = timeout
        self.filler_id = filler_id
        self.defaults = defaults
        self.on_batch = on_batch
        self.last_counts: BatchCounts | None = None

    def __call__(self, prompts: list[str], trainer: Trainer) -> RolloutOutput:
        group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        runs = _layout(prompts, group_size, trainer.accelerator.process_index * len(prompts))
        tasks = [_task(prompts[start], stop - start, self.defaults) for start, stop in runs]
        batch = run_batch(self.client, tasks, self.timeout, self.settings)
        filler = self.filler_id if self.filler_id is not None else trainer.eos_token_ids[0]
        samples = [
            replace(sample, info={**sample.info, "used": used, "group": group.info()})
            for group in batch.groups
            for sample, used in zip((to_sample(r, filler) for r in group.results), group.used, strict=True)
        ]
        self.last_counts = batch.counts
        if self.on_batch is not None:
            self.on_batch(batch.counts)
        return _output(samples)


def rollout_func(
    server: str | Client,
    *,
    sampling: SamplingParams | None = None,
    agent: AgentLimits | None = None,
    timeouts: Timeouts | None = None,
    timeout: float = 3600.0,
    filler_id: int | None = None,
    oversample: int = 0,
    filter_zero_variance: bool = False,
    on_batch: Callable[[BatchCounts], None] | None = None,
) -> RolloutFunction:
    """A ``rollout_func`` for ``GRPOTrainer``: each group of this process's prompts goes
    to rollserve as one task with ``n`` = the group's prompts here (``num_generations``
    unless the group straddles two processes); waits at most ``timeout`` seconds for the
    batch; raises ``IncompleteGroupError`` naming a group still in flight then, and
    ``MultiSequenceError`` naming a result of several token sequences.

    ``sampling``/``agent``/``timeouts``: for every task (a row's own win). ``oversample``:
    extra rollouts each group starts (cancelled once ``n`` are usable);
    ``filter_zero_variance``: DAPO's filter (a row's ``oversample`` and
    ``filter_zero_variance`` win). Each group gives ``n`` rows: its used samples, in
    sample order; a group the server flags ``zero_variance``, or ``too_few_usable``
    while over-sampling, gives masked rows (``rollserve.integrations.groups``).
    ``filler_id``: the token that fills an empty prompt or completion (default: the
    trainer's EOS). ``on_batch``: called with each batch's ``BatchCounts`` (also in the
    function's ``last_counts``). Returns ``prompt_ids``, ``completion_ids``,
    ``logprobs``, ``env_mask`` and, per completion, ``rollserve_reward`` (None when
    masked), ``rollserve_reward_components`` (the result's named components: correctness,
    format, judge...; None when masked), ``rollserve_masked``, ``rollserve_id``, ``rollserve_group_id`` and
    ``rollserve_info`` (status, mask reason, policy versions, the task's metadata,
    ``used``, and ``group``: its verdict and counts).
    """
    client = Client(server) if isinstance(server, str) else server
    defaults: dict[str, JsonValue] = {}
    if oversample:
        defaults["oversample"] = oversample
    if filter_zero_variance:
        defaults["filter_zero_variance"] = True
    return RolloutFunction(
        client, BatchSettings(sampling=sampling, agent=agent, timeouts=timeouts), timeout, filler_id, defaults, on_batch
    )


def _output(samples: Sequence[Sample]) -> RolloutOutput:
    return {
        "prompt_ids": [s.prompt_ids for s in samples],
        "completion_ids": [s.completion_ids for s in samples],
        "logprobs": [s.logprobs for s in samples],
        "env_mask": [s.env_mask for s in samples],
        "rollserve_reward": [s.reward for s in samples],
        "rollserve_reward_components": [s.reward_components for s in samples],
        "rollserve_masked": [s.masked for s in samples],
        "rollserve_id": [s.result_id for s in samples],
        "rollserve_group_id": [s.group_id for s in samples],
        "rollserve_info": [s.info for s in samples],
    }


def rollserve_reward(prompts: list[str], completions: list[object], **columns: object) -> list[float | None]:
    """A reward function for ``GRPOTrainer``: rollserve's reward of each completion,
    None on a masked one (TRL leaves it out of its group's baseline)."""
    rewards = columns.get("rollserve_reward")
    if not isinstance(rewards, list) or len(rewards) != len(completions):
        raise TypeError(
            "rollserve_reward needs the rollserve_reward column that rollserve.integrations.trl.rollout_func returns"
        )
    return [None if reward is None else float(reward) for reward in rewards]

"""Submit a batch of tasks and wait, bounded, for every group's verdict and samples.

Shared by the trainer adapters. A trainer needs exactly ``n`` rows per group, in
order. The server says which samples a group gives for training (``GroupMember.used``:
the first ``n`` usable in completion order; with ``oversample`` the extras are
cancelled) and whether the group is usable (``GroupView.reasons``). Each group becomes
``n`` rows (``GroupRows``):

- the rows are the ``used`` samples, and when fewer than ``n`` are used (the group is
  ``too_few_usable``), the other finished samples in sample order until there are
  ``n``; the rows are in sample order;
- a row is trained on only if it is ``used`` and its group is not masked whole; every
  other row comes back as a copy of its result with ``mask`` true (its own
  ``mask_reason`` kept when it had one, else ``not used by its group``);
- the group is masked whole (``masked_whole``) when the server flags it
  ``zero_variance`` (the filter), or ``too_few_usable`` while it over-samples (the
  trainer asked for ``n`` usable samples and ``n + oversample`` starts gave fewer);
  its rows' ``mask_reason`` is ``group not usable: <reason>``. Without over-sampling, a
  group short of usable samples keeps its usable ones (each masked sample is masked on
  its own, as a trainer left out of a group's baseline).

A group still ``in_flight`` at the deadline (fewer than ``n`` usable and some still
running), or one the server answers with another size, is an ``IncompleteGroupError``
naming it, raised after the batch's groups are cancelled (nothing the trainer gave up
on keeps running on the server).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from pydantic import JsonValue

from rollserve.client import Client, RollserveError
from rollserve.contract import (
    AgentLimits,
    GroupReason,
    GroupView,
    RolloutResult,
    SamplingParams,
    TaskRequest,
    Timeouts,
)
from rollserve.integrations.tensors import trainable

NOT_USED = "not used by its group"
GROUP_MASK = "group not usable"


class IncompleteGroupError(RuntimeError):
    """A group still in flight at the deadline (fewer usable samples than the trainer
    asked for), or answered with another size."""

    def __init__(self, group_id: str, asked: int, got: int, reason: str) -> None:
        super().__init__(f"group {group_id}: asked for {asked} samples, got {got} ({reason})")
        self.group_id = group_id
        self.asked = asked
        self.got = got


@dataclass(frozen=True)
class BatchSettings:
    """Settings for every task of a batch (a task's own fields win, as the server merges
    them)."""

    sampling: SamplingParams | None = None
    agent: AgentLimits | None = None
    timeouts: Timeouts | None = None


@dataclass(frozen=True)
class GroupRows:
    """One group as ``n`` trainer rows (see the module's docstring)."""

    view: GroupView  # the server's verdict and counts (members with their results)
    results: list[RolloutResult]  # n, in sample order; mask true on a row not to train on
    used: list[bool]  # per row: the server's GroupMember.used
    masked_whole: GroupReason | None  # why every row is masked, else None

    def info(self) -> dict[str, JsonValue]:
        """The group's verdict as plain JSON, for a trainer's logs."""
        return {
            "n": self.view.n,
            "oversample": self.view.oversample,
            "filter_zero_variance": self.view.filter_zero_variance,
            "usable": self.view.usable,
            "reasons": list(self.view.reasons),
            "masked_whole": self.masked_whole,
            "counts": self.view.counts.model_dump(mode="json"),
        }


@dataclass(frozen=True)
class BatchCounts:
    """One batch's groups and samples, summed over its groups (``GroupCounts``), and its
    rows: ``rows_trained`` are those that may enter the loss."""

    groups: int = 0
    groups_usable: int = 0
    groups_filtered: int = 0  # flagged zero_variance
    groups_too_few_usable: int = 0
    groups_masked: int = 0  # masked whole (filtered, or short while over-sampling)
    started: int = 0
    finished: int = 0
    usable: int = 0
    used: int = 0
    cancelled: int = 0
    masked: int = 0
    filtered: int = 0  # used samples of filtered groups
    rows: int = 0
    rows_trained: int = 0

    @classmethod
    def of(cls, groups: Sequence[GroupRows]) -> BatchCounts:
        totals = {
            key: sum(getattr(g.view.counts, key) for g in groups)
            for key in ("started", "finished", "usable", "used", "cancelled", "masked", "filtered")
        }
        return cls(
            groups=len(groups),
            groups_usable=sum(g.view.usable for g in groups),
            groups_filtered=sum("zero_variance" in g.view.reasons for g in groups),
            groups_too_few_usable=sum("too_few_usable" in g.view.reasons for g in groups),
            groups_masked=sum(g.masked_whole is not None for g in groups),
            rows=sum(len(g.results) for g in groups),
            rows_trained=sum(trainable(r) for g in groups for r in g.results),
            **totals,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Batch:
    """Every group of a submitted batch, in task order, and the batch's counts."""

    groups: list[GroupRows]
    counts: BatchCounts = field(default_factory=BatchCounts)


def _cancel(client: Client, group_ids: Sequence[str]) -> None:
    """Stop what is still running of these groups (best effort: the error that follows
    matters more than a cancel that could not be sent)."""
    for group_id in group_ids:
        try:
            client.cancel_group(group_id)
        except (RollserveError, OSError):
            pass


def _masked(result: RolloutResult, reason: str) -> RolloutResult:
    """A copy of ``result`` marked not to be trained on (its own mask reason kept)."""
    if result.mask:
        return result
    return result.model_copy(update={"mask": True, "mask_reason": reason})


def _rows(task: TaskRequest, view: GroupView, timeout: float) -> GroupRows:
    """The group's ``n`` rows, or ``IncompleteGroupError`` (not cancelled here)."""
    if view.n != task.n or len(view.rollouts) != task.n + task.oversample:
        raise IncompleteGroupError(
            view.group_id, task.n, view.counts.used, "the server answered a different group size"
        )
    finished = [(m.used, m.result) for m in view.rollouts if m.result is not None]
    chosen = [pair for pair in finished if pair[0]]
    chosen += [pair for pair in finished if not pair[0]][: max(0, task.n - len(chosen))]
    if "in_flight" in view.reasons or len(chosen) != task.n:
        raise IncompleteGroupError(view.group_id, task.n, view.counts.used, f"not finished within {timeout:g} s")
    whole: GroupReason | None = None
    if "zero_variance" in view.reasons:
        whole = "zero_variance"
    elif "too_few_usable" in view.reasons and view.oversample > 0:
        whole = "too_few_usable"
    chosen.sort(key=lambda pair: pair[1].sample_index)
    results = [
        _masked(result, f"{GROUP_MASK}: {whole}")
        if whole is not None
        else result
        if used
        else _masked(result, NOT_USED)
        for used, result in chosen
    ]
    return GroupRows(view=view, results=results, used=[used for used, _ in chosen], masked_whole=whole)


def run_batch(
    client: Client, tasks: Sequence[TaskRequest], timeout: float, settings: BatchSettings | None = None
) -> Batch:
    """Submit ``tasks`` as one batch; return each task's ``n`` rows (``GroupRows``) and
    the batch's counts. Waits at most ``timeout`` seconds for the whole batch; raises
    ``IncompleteGroupError`` (after cancelling the batch's groups) for a group still in
    flight then, or answered with another size."""
    deadline = time.monotonic() + timeout
    settings = settings or BatchSettings()
    accepted = client.submit(
        list(tasks), sampling=settings.sampling, agent=settings.agent, timeouts=settings.timeouts
    ).groups
    group_ids = [group.group_id for group in accepted]
    out: list[GroupRows] = []
    for task, group in zip(tasks, accepted, strict=True):
        try:
            view = client.wait_group(group.group_id, timeout=max(0.0, deadline - time.monotonic()))
            out.append(_rows(task, view, timeout))
        except BaseException:
            _cancel(client, group_ids)
            raise
    return Batch(groups=out, counts=BatchCounts.of(out))


def run_groups(
    client: Client, tasks: Sequence[TaskRequest], timeout: float, settings: BatchSettings | None = None
) -> list[list[RolloutResult]]:
    """``run_batch``'s rows only: each task's ``n`` results in sample order, a result not
    to be trained on with ``mask`` true (see the module's docstring)."""
    return [group.results for group in run_batch(client, tasks, timeout, settings).groups]

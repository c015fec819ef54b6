"""Submit a batch of tasks and wait, bounded, for every sample of every group.

Shared by the trainer adapters. A trainer needs exactly the samples it asked for, in
order; anything less is an ``IncompleteGroupError`` naming the group, raised after the
batch's unfinished rollouts are cancelled (nothing the trainer gave up on keeps running
on the server).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rollserve.client import Client, RollserveError
from rollserve.contract import AgentLimits, RolloutResult, SamplingParams, TaskRequest, Timeouts


class IncompleteGroupError(RuntimeError):
    """rollserve gave fewer finished samples for a group than the trainer asked for."""

    def __init__(self, group_id: str, asked: int, got: int, reason: str):
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


def _cancel(client: Client, group_ids: Sequence[str]) -> None:
    """Stop what is still running of these groups (best effort: the error that follows
    matters more than a cancel that could not be sent)."""
    for group_id in group_ids:
        try:
            client.cancel_group(group_id)
        except (RollserveError, OSError):
            pass


def run_groups(client: Client, tasks: Sequence[TaskRequest], timeout: float,
               settings: BatchSettings | None = None) -> list[list[RolloutResult]]:
    """Submit ``tasks`` as one batch; return each task's ``n`` results in sample order.

    Waits at most ``timeout`` seconds for the whole batch. Raises ``IncompleteGroupError``
    (after cancelling the batch's groups) when a group is unfinished by then or has fewer
    results than its ``n``.
    """
    deadline = time.monotonic() + timeout
    settings = settings or BatchSettings()
    accepted = client.submit(list(tasks), sampling=settings.sampling, agent=settings.agent,
                             timeouts=settings.timeouts).groups
    group_ids = [group.group_id for group in accepted]
    out: list[list[RolloutResult]] = []
    for task, group in zip(tasks, accepted, strict=True):
        try:
            view = client.wait_group(group.group_id, timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            _cancel(client, group_ids)
            raise
        results = [member.result for member in view.rollouts if member.result is not None]
        if len(results) != task.n or len(view.rollouts) != task.n:
            _cancel(client, group_ids)
            reason = (f"not finished within {timeout:g} s" if not view.done
                      else "the server answered a different group size")
            raise IncompleteGroupError(group.group_id, task.n, len(results), reason)
        out.append(sorted(results, key=lambda result: result.sample_index))
    return out

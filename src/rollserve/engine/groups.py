"""A group's verdict: which samples it gives for training, and whether it is usable.

A sample is *usable* when its result is stored, it is not masked, it has a reward, and
it ended ``completed`` or ``failed`` (an agent's own failure, scored). The group *uses*
the first ``n`` usable samples in completion order (cursor ``seq``): with over-sampling
several can finish at once, and the extras beyond ``n`` are not used. The group is
*settled* once ``n`` are used (its extras are then cancelled) or once every rollout has
ended; it is *usable* when ``n`` are used and the zero-variance filter (when asked) does
not drop it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollserve.contract import (
    TERMINAL,
    GroupCounters,
    GroupCounts,
    GroupReason,
    RolloutResult,
    RolloutStatus,
)
from rollserve.engine.rollout import RolloutSpec

ZERO_VARIANCE_TOLERANCE = 1e-9  # rewards this close count as equal (DAPO's std == 0)
EARLY_STOP_MESSAGE = "cancelled: the group had its n usable samples (over-sampling early stop)"


def result_usable(result: RolloutResult) -> bool:
    """Finished, not masked, with a reward, completed or failed by the agent."""
    return result.status in ("completed", "failed") and not result.mask and result.reward is not None


@dataclass(frozen=True)
class Outcome:
    """One rollout of a group as the verdict reads it."""

    id: str
    status: RolloutStatus  # live status while in flight, else the stored one
    seq: int | None  # set once its result is stored
    usable: bool  # its stored result is usable (False while in flight)
    reward: float | None  # its stored reward
    masked: bool  # its stored result is masked

    @property
    def done(self) -> bool:
        return self.seq is not None and self.status in TERMINAL


@dataclass(frozen=True)
class Verdict:
    used: frozenset[str]
    usable: bool
    settled: bool
    reasons: list[GroupReason]
    counts: GroupCounts


def judge(n: int, filter_zero_variance: bool, outcomes: Sequence[Outcome]) -> Verdict:
    """The group's verdict from its rollouts' outcomes."""
    usable = sorted((o for o in outcomes if o.done and o.usable), key=lambda o: o.seq if o.seq is not None else 0)
    used = usable[:n]
    all_ended = all(o.done for o in outcomes)
    settled = len(used) >= n or all_ended
    rewards = [o.reward for o in used if o.reward is not None]
    zero_variance = (
        filter_zero_variance
        and len(used) >= n
        and len(rewards) >= 2
        and max(rewards) - min(rewards) <= ZERO_VARIANCE_TOLERANCE
    )
    reasons: list[GroupReason] = []
    if len(used) < n:
        reasons.append("too_few_usable" if all_ended else "in_flight")
    if zero_variance:
        reasons.append("zero_variance")
    cancelled = sum(1 for o in outcomes if o.done and o.status == "cancelled")
    counts = GroupCounts(
        started=len(outcomes),
        finished=sum(1 for o in outcomes if o.done),
        usable=len(usable),
        used=len(used),
        cancelled=cancelled,
        masked=sum(1 for o in outcomes if o.done and o.masked and o.status != "cancelled"),
        filtered=len(used) if zero_variance else 0,
    )
    return Verdict(
        used=frozenset(o.id for o in used), usable=not reasons, settled=settled, reasons=reasons, counts=counts
    )


class OutcomeSource(Protocol):
    """Where the tracker reads a group's outcomes (the store)."""

    async def group_outcomes(self, group_id: str) -> list[Outcome]: ...


class GroupTracker:
    """The engine's side of groups: which rollouts of each group are in flight, when a
    group settles (counted once), and which extras to cancel once it has its n."""

    def __init__(self) -> None:
        self.counters = GroupCounters(
            samples_started=0,
            samples_usable=0,
            samples_used=0,
            samples_cancelled=0,
            groups_settled=0,
            groups_usable=0,
            groups_too_few_usable=0,
            groups_filtered=0,
        )
        self._live: dict[str, set[str]] = {}  # group id -> its rollouts in flight
        self._settled: set[str] = set()  # settled groups that still have rollouts in flight

    def started(self, spec: RolloutSpec, admitted: bool) -> None:
        """A rollout of ``spec``'s group is in flight (``admitted``: newly, not re-queued)."""
        self._live.setdefault(spec.group_id, set()).add(spec.id)
        if admitted:
            self.counters.samples_started += 1

    def ended(self, spec: RolloutSpec) -> None:
        """It is no longer in flight (its result stored, or the server stopping)."""
        members = self._live.get(spec.group_id)
        if members is None:
            return
        members.discard(spec.id)
        if not members:
            del self._live[spec.group_id]
            self._settled.discard(spec.group_id)

    def early_stopped(self) -> None:
        self.counters.samples_cancelled += 1

    async def on_result(self, store: OutcomeSource, spec: RolloutSpec, result_was_usable: bool) -> list[str]:
        """Count a stored result; once the group settles, count it and return the ids of
        its other rollouts in flight to cancel (only when it over-samples)."""
        self.counters.samples_usable += result_was_usable
        if spec.group_n is None or spec.group_id in self._settled:
            return []
        others = self._live.get(spec.group_id, set()) - {spec.id}
        if not result_was_usable and others:
            return []  # nothing that could settle it changed
        verdict = judge(spec.group_n, spec.filter_zero_variance, await store.group_outcomes(spec.group_id))
        if not verdict.settled or spec.group_id in self._settled:  # (another result came first)
            return []
        self._settled.add(spec.group_id)
        c = self.counters
        c.groups_settled += 1
        c.samples_used += verdict.counts.used
        c.groups_usable += verdict.usable
        c.groups_too_few_usable += "too_few_usable" in verdict.reasons
        c.groups_filtered += "zero_variance" in verdict.reasons
        others = self._live.get(spec.group_id, set()) - {spec.id}
        return sorted(others) if spec.oversample > 0 else []


async def needs_no_rerun(store: OutcomeSource, spec: RolloutSpec) -> bool:
    """At recovery: an over-sampling group already has its n usable samples, so this
    unfinished extra is not re-run (it ends cancelled)."""
    if spec.group_n is None or spec.oversample <= 0:
        return False
    verdict = judge(spec.group_n, spec.filter_zero_variance, await store.group_outcomes(spec.group_id))
    return verdict.counts.used >= spec.group_n

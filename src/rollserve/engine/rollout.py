"""A rollout: its spec (what was asked, durable) and its live state."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, Field, JsonValue, ValidationError

from rollserve.agent import Trajectory
from rollserve.contract import (
    STAGES,
    TERMINAL,
    AgentLimits,
    Failure,
    RolloutResult,
    RolloutStatus,
    SamplingParams,
    TerminalStatus,
    Timeouts,
)
from rollserve.contract.judge import JudgeRequest
from rollserve.contract.validation import describe
from rollserve.handlers.base import Evaluation, RolloutResources

MAX_FAILURE_CHARS = 1000  # of a validation error quoted in a failure message


def default_run_margin(run: float) -> float:
    """``Timeouts.run_margin`` when unset: 10% of the RUN timeout, between 10 and 60 s."""
    return min(60.0, max(10.0, 0.1 * run))


__all__ = ["STAGES", "TERMINAL", "Failure", "Rollout", "RolloutSpec", "Timeouts", "default_run_margin"]


class RolloutSpec(BaseModel):
    """Everything needed to (re-)run one rollout; stored as submitted."""

    id: str
    group_id: str
    task_id: str
    data_source: str
    sample_index: int
    instance: dict[str, Any]
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    agent: AgentLimits = Field(default_factory=AgentLimits)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # The group's policy (the same in each of its specs). group_n is None in specs
    # stored before it existed: such a group has no verdict counted and no early stop.
    group_n: int | None = None  # usable samples the group wants
    oversample: int = 0  # extras started beyond group_n: cancelled once group_n are usable
    filter_zero_variance: bool = False
    judge: JudgeRequest | None = None  # a judge reward on top of the family's outcome


class _Status:
    """``Rollout.status``: kept in the instance's dict, and counted in its ``tally``
    (when it has one) as it changes. A descriptor rather than a ``__setattr__`` of the
    class's own: building a rollout then sets its other fields at plain speed (a
    batch of 1,000 is built while the POST waits)."""

    def __get__(self, obj: Rollout | None, owner: type | None = None) -> RolloutStatus:
        if obj is None:
            return "queued"  # (the field's default, as the dataclass reads it)
        status: RolloutStatus = obj.__dict__["status"]
        return status

    def __set__(self, obj: Rollout, value: RolloutStatus) -> None:
        tally = obj.__dict__.get("tally")
        if tally is not None:
            tally[obj.__dict__["status"]] -= 1
            tally[value] += 1
        obj.__dict__["status"] = value


class _Tally:
    """``Rollout.tally``: the count it is kept in; set, it counts the status now."""

    def __get__(self, obj: Rollout | None, owner: type | None = None) -> Counter[RolloutStatus] | None:
        if obj is None:
            return None  # (the field's default)
        tally: Counter[RolloutStatus] | None = obj.__dict__["tally"]
        return tally

    def __set__(self, obj: Rollout, value: Counter[RolloutStatus] | _Tally | None) -> None:
        if isinstance(value, _Tally):  # the dataclass's __init__ passes ``field``'s default as it is
            value = None
        if value is not None:
            value[obj.__dict__["status"]] += 1  # counted from now on
        obj.__dict__["tally"] = value


@dataclass
class Rollout:
    """A rollout in flight: its spec, limits, state and what it produced. Handlers see
    it as a ``handlers.base.RolloutView``."""

    spec: RolloutSpec
    max_turns: int = 1
    max_context_tokens: int = 2048
    timeouts: Timeouts = field(default_factory=Timeouts)  # resolved: every field set
    status: _Status = _Status()
    trajectory: Trajectory = field(default_factory=Trajectory)
    reward: float | None = None
    evaluation: dict[str, Any] | None = None
    reward_components: dict[str, float] | None = None  # the handler's named parts of reward
    failure: Failure | None = None
    timing: dict[str, float] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    llm: Any = None  # the sticky LLM session, set by the engine before RUN
    state: object | None = None  # the handler's typed state (``AgentHandler.state``)
    resources: RolloutResources = field(default_factory=RolloutResources)  # cleanup frees them
    attempt: int = 1
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    deadline: float | None = None  # loop time by which the whole rollout must end
    run_deadline: float | None = None  # loop time by which RUN must end (stage or rollout's)
    max_staleness: int | None = None  # turns may span at most this many policy versions
    mask_stale: bool = False  # mask a rollout whose turns span more
    # The engine's count of rollouts in flight per status, kept as ``status`` changes
    # (``GET /v1/status`` reads it without walking every rollout); None: not counted.
    tally: _Tally = field(default=_Tally(), repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def instance(self) -> dict[str, Any]:
        return self.spec.instance

    @property
    def metadata(self) -> dict[str, Any]:
        return self.spec.metadata

    @property
    def judge(self) -> JudgeRequest | None:
        return self.spec.judge

    @property
    def sampling(self) -> SamplingParams:
        return self.spec.sampling

    @property
    def stale(self) -> bool:
        """Its turns were sampled by policy versions more than ``max_staleness`` apart."""
        versions = self.trajectory.policy_versions
        return self.max_staleness is not None and len(versions) > 1 and versions[-1] - versions[0] > self.max_staleness

    @property
    def mask(self) -> bool:
        """True: do not train on this (infrastructure failure, timeout, interruption,
        or turns too stale when the server masks those)."""
        return self.mask_reason is not None

    @property
    def mask_reason(self) -> str | None:
        if self.failure is not None and self.failure.kind in ("infra", "timeout"):
            return f"{self.failure.kind} failure in {self.failure.stage}: {self.failure.message}"
        if self.mask_stale and self.stale:
            versions = self.trajectory.policy_versions
            return (
                f"stale: turns sampled by policy versions {versions[0]}..{versions[-1]} "
                f"(max_staleness {self.max_staleness})"
            )
        return None

    def agent_deadline(self, now: float) -> float | None:
        """Loop time at which the agent's episode ends itself (``agent.clock``): the
        RUN deadline less ``run_margin``, and less EVAL's timeout too when the rollout's
        own deadline is the earlier (so scoring still fits), but never more than half
        the time RUN has left at ``now``. None outside an engine's RUN stage."""
        if self.run_deadline is None:
            return None
        t = self.timeouts
        reserve = t.run_margin or default_run_margin(t.run or self.run_deadline - now)
        if self.deadline is not None and self.deadline <= self.run_deadline and t.eval:
            reserve += t.eval
        return self.run_deadline - min(reserve, max(0.0, self.run_deadline - now) / 2)

    def scored(self, evaluation: Evaluation) -> None:
        """EVAL's score on the rollout: its reward, details and named components."""
        self.reward = float(evaluation.reward)
        self.evaluation = evaluation.details
        self.reward_components = evaluation.reward_components()

    def new_attempt(self) -> None:
        """Start the rollout over as its next attempt: what the last one produced (its
        trajectory, reward, handler state and resources) is dropped; timing is kept."""
        self.attempt += 1
        self.trajectory = Trajectory()
        self.reward = None
        self.evaluation = None
        self.reward_components = None
        self.failure = None
        self.stats = {}
        self.llm = None
        self.state = None
        self.resources = RolloutResources()
        self.run_deadline = None

    def add_time(self, key: str, seconds: float) -> None:
        self.timing[key] = round(self.timing.get(key, 0.0) + seconds, 6)

    def add_stats(self, counts: Mapping[str, int]) -> None:
        self.stats.update(counts)

    def result(self) -> RolloutResult:
        """The result as the contract has it (``seq`` is the store's to give)."""
        spec = self.spec
        traj = self.trajectory
        if self.status not in TERMINAL:
            raise ValueError(f"rollout {spec.id} is {self.status}: not finished")
        status = cast(TerminalStatus, self.status)
        return RolloutResult(
            id=spec.id,
            group_id=spec.group_id,
            task_id=spec.task_id,
            data_source=spec.data_source,
            sample_index=spec.sample_index,
            status=status,
            reward=self.reward,
            evaluation=_plain_json(self.evaluation),
            reward_components=self.reward_components if self.reward is not None else None,
            failure=self.failure,
            mask=self.mask,
            mask_reason=self.mask_reason,
            stale=self.stale,
            trajectory=traj.to_wire(),
            # Plain dicts, validated in place: an error names stats.<key> or timing.<key>.
            timing=dict(self.timing),
            stats={
                "turns": len(traj.turns),
                "prompt_tokens": traj.prompt_tokens,
                "output_tokens": traj.output_tokens,
                "truncated_turns": traj.truncated_turns,
                **self.stats,
            },
            attempt=self.attempt,
            metadata=spec.metadata,
        )

    def final_result(self) -> RolloutResult:
        """``result()``, always: when what the handler left does not fit the contract (a
        stat that is not a count, say), the rollout fails as an infrastructure failure
        (masked, nothing scored) with the handler's own stats and evaluation dropped, so
        a result is still stored rather than the rollout left unfinished."""
        try:
            return self.result()
        except ValidationError as exc:
            stage = self.failure.stage if self.failure is not None else "eval"
            self.status, self.reward, self.evaluation, self.stats = "failed", None, None, {}
            self.reward_components = None
            self.failure = Failure(
                stage=stage,
                kind="infra",
                message="the handler's result does not fit the contract: " + describe(exc)[:MAX_FAILURE_CHARS],
            )
            return self.result()


def _plain_json(details: dict[str, Any] | None) -> dict[str, JsonValue] | None:
    """A handler's evaluation details as plain JSON (tuples become lists, keys strings,
    as the store always wrote them); a value JSON cannot hold is kept as its ``repr``,
    so a plugin's odd detail never costs the rollout its result."""
    if details is None:
        return None
    plain: dict[str, JsonValue] = json.loads(json.dumps(details, default=repr))
    return plain


plain_json = _plain_json  # (re-scoring writes evaluations as the pipeline does)

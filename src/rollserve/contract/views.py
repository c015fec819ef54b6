"""What the rollout routes answer: admissions, views of rollouts and groups, pages of
the results cursor, cancellations, state events and the service's status."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rollserve.contract.llm import BackendState, RouterStatus
from rollserve.contract.requests import JSONObject
from rollserve.contract.result import (
    RolloutResult,
    RolloutStatus,
    Stage,
    TerminalStatus,
)


class Accepted(BaseModel):
    """One task admitted: its group and the ids of its ``n`` rollouts."""

    group_id: str = Field(description="the group: the task's n samples")
    task_id: str = Field(description="the task's client-chosen id, else the group id")
    rollout_ids: list[str] = Field(description="one per sample, in sample order")
    duplicate: bool = Field(
        False, description="an idempotent retry of a task already accepted (the same group comes back)"
    )


class SubmitResponse(BaseModel):
    """``POST /v1/rollouts``: every task of the batch, in order."""

    groups: list[Accepted] = Field(description="each task of the batch, in order")


class RolloutView(BaseModel):
    """A rollout's state, and its result once stored."""

    id: str = Field(description="the rollout's id")
    group_id: str = Field(description="its group")
    status: RolloutStatus = Field(description="queued | init | run | eval while in flight, then how it ended")
    done: bool = Field(description="its result is stored")
    seq: int | None = Field(description="its position in the results cursor, once done")
    result: RolloutResult | None = Field(description="null until done")


class GroupMember(BaseModel):
    """One rollout of a group."""

    id: str = Field(description="the rollout's id")
    status: RolloutStatus = Field(description="queued | init | run | eval, then how it ended")
    done: bool = Field(description="its result is stored")
    seq: int | None = Field(description="its position in the results cursor, once done")
    used: bool = Field(
        description="one of the group's n samples for training: usable (finished, not masked, "
        "with a reward) and among the first n usable in completion order"
    )
    result: RolloutResult | None = Field(None, description="once done (null when asked without results)")


GroupReason = Literal["in_flight", "too_few_usable", "zero_variance"]


class GroupCounts(BaseModel):
    """How a group's rollouts went."""

    started: int = Field(description="rollouts started: n + oversample")
    finished: int = Field(description="rollouts with a stored result")
    usable: int = Field(
        description="finished, not masked, with a reward (completed, or failed by the agent and scored)"
    )
    used: int = Field(
        description="usable ones the group gives for training: the first n in "
        "completion order (more can be usable when several finish at "
        "once)"
    )
    cancelled: int = Field(description="ended cancelled: extras stopped once n were usable, or cancelled by the client")
    masked: int = Field(
        description="ended masked for another reason (infrastructure failure, timeout, interruption, stale)"
    )
    filtered: int = Field(
        description="used samples dropped by the zero-variance filter (n when the group is filtered, else 0)"
    )


class GroupView(BaseModel):
    """A task's samples together, and whether they are fit to train on."""

    group_id: str = Field(description="the group's id")
    task_id: str = Field(description="the task's client-chosen id, else the group id")
    n: int = Field(description="samples asked for (usable samples wanted)")
    oversample: int = Field(description="extra rollouts started beyond n (early stop)")
    filter_zero_variance: bool = Field(description="the task asked for the zero-variance filter")
    done: bool = Field(description="every rollout's result is stored")
    usable: bool = Field(
        description="fit for a training step: n samples are used and the group is not "
        "filtered (extras may still be ending as cancelled)"
    )
    reasons: list[GroupReason] = Field(
        description="why not usable (empty when usable): in_flight (fewer than n usable so "
        "far, some still running), too_few_usable (every rollout ended, fewer "
        "than n usable), zero_variance (filtered: the n used rewards all agree)"
    )
    counts: GroupCounts = Field(description="started, finished, usable, used, cancelled, masked, filtered")
    status_counts: dict[RolloutStatus, int] = Field(description="rollouts per status")
    rollouts: list[GroupMember] = Field(description="in sample order (the n + oversample started)")

    def used_results(self) -> list[RolloutResult]:
        """The results of the samples the group gives for training (``used``), in
        completion order; empty when asked without results."""
        used = [m.result for m in self.rollouts if m.used and m.result is not None]
        return sorted(used, key=lambda r: r.seq if r.seq is not None else 0)


class RunResponse(GroupView):
    """``POST /v1/rollouts:run``: the group, and its results in sample order (null for a
    rollout unfinished when the wait ended)."""

    results: list[RolloutResult | None] = Field(
        description="each rollout's result in sample order; null for one unfinished when the wait ended"
    )


class ResultsPage(BaseModel):
    """A page of the results cursor, in completion order."""

    results: list[RolloutResult] = Field(description="each with its seq")
    next: int = Field(
        description="pass it as ``after`` for the next page (the last seq read, "
        "or ``after`` itself when none was; results the ``rescored`` "
        "filter left out are read past, so a page may be empty and "
        "still move it)"
    )


class CancelResponse(BaseModel):
    """``DELETE /v1/rollouts/{id}``."""

    id: str = Field(description="the rollout's id")
    cancelled: bool = Field(description="it was in flight and is now stopped")
    status: RolloutStatus = Field(description="its status after the cancel")


class GroupCancelResponse(BaseModel):
    """``DELETE /v1/groups/{id}``."""

    group_id: str = Field(description="the group's id")
    cancelled: list[str] = Field(description="the rollouts that were in flight and are stopped")


class StateEvent(BaseModel):
    """One rollout state change (``GET /v1/events``, as JSON in each ``state`` event).
    ``lagged``: this subscriber was too slow and lost older events."""

    rollout_id: str | None = Field(None, description="the rollout (null on a lagged event)")
    group_id: str | None = Field(None, description="its group (null on a lagged event)")
    status: RolloutStatus | Literal["lagged"] = Field(
        description="its new status, or lagged: this subscriber lost older events"
    )
    time: float = Field(description="Unix time of the change")
    reward: float | None = Field(None, description="on a finished rollout's event")
    mask: bool | None = Field(None, description="on a finished rollout's event")


class StageStatus(BaseModel):
    """One stage's pool."""

    workers: int = Field(description="concurrent slots")
    busy: int = Field(description="slots in use")
    queued: int = Field(description="rollouts waiting for a slot")
    done: int = Field(description="stage runs finished since start")
    busy_seconds: float = Field(description="slot-seconds used since start")


class NodeStatus(BaseModel):
    """One Ray node's worker (``rollserve serve --ray``): its slots and what it hosts."""

    name: str = Field(description="the node's name: its rollserve-node label, else its host name")
    node_id: str = Field(description="Ray's node id")
    alive: bool = Field(description="the node and its worker answer")
    draining: bool = Field(description="takes no new rollouts; finishes its own")
    slots: int = Field(description="rollouts it may host at once (its 'rollserve' resource)")
    hosted: int = Field(description="rollouts placed there and not cleaned up yet")
    queued: int = Field(description="rollouts waiting for a free slot on any node (the same for all)")
    busy: dict[Stage, int] = Field(description="stage calls running there now, by stage")
    done: dict[Stage, int] = Field(description="stage calls finished there, by stage")
    placed: int = Field(description="rollouts placed there since the server started")
    lost: int = Field(description="rollout attempts that ended because the node died")
    sandboxes_open: int = Field(description="sandboxes its worker holds open (last report)")
    reaped_at_start: int = Field(description="sandboxes of a dead predecessor its worker reaped")


class NodesChanged(BaseModel):
    """``POST /v1/nodes/{name}/drain`` and ``/undrain``: the node's workers now."""

    nodes: list[NodeStatus] = Field(
        description="every worker of that name (a node's dead workers too), as /v1/status shows them"
    )


class TrajectoryCounters(BaseModel):
    """Over the rollouts finished since start."""

    fidelity_mismatches: int = Field(description="tokens that differed from a fresh render")
    rollouts_with_mismatches: int = Field(description="rollouts with at least one mismatch")
    truncated_turns: int = Field(description="turns cut by max_tokens")
    stale: int = Field(description="rollouts whose turns span more than max_staleness")
    not_trainable: int = Field(description="rollouts from message-level backends")
    prompt_tokens: int = Field(0, description="prompt tokens in their sequences")
    output_tokens: int = Field(0, description="tokens the policy sampled in them")


class GroupCounters(BaseModel):
    """Over-sampling and the zero-variance filter, since start. A group is counted once
    it is settled: n of its samples used, or every rollout ended."""

    samples_started: int = Field(description="rollouts admitted (n + oversample per group)")
    samples_usable: int = Field(description="rollouts finished usable (not masked, with a reward)")
    samples_used: int = Field(description="usable rollouts given for training (the first n of each settled group)")
    samples_cancelled: int = Field(description="extra rollouts cancelled because their group had its n usable samples")
    groups_settled: int = Field(description="groups settled")
    groups_usable: int = Field(description="settled with n used samples and not filtered")
    groups_too_few_usable: int = Field(description="every rollout ended with fewer than n usable")
    groups_filtered: int = Field(description="dropped by the zero-variance filter")


class Recovered(BaseModel):
    """What the server found unfinished at start (left by a previous server)."""

    requeued: int = Field(0, description="re-queued to run again")
    interrupted: int = Field(0, description="ended as interrupted")
    cancelled: int = Field(
        0,
        description="extras of over-sampling groups that already had "
        "their n usable samples: ended cancelled, not re-run",
    )


class EngineStatus(BaseModel):
    """The engine's side of ``GET /v1/status``."""

    uptime_s: float = Field(description="seconds since the server started")
    in_flight: int = Field(description="rollouts admitted and not finished")
    max_pending: int = Field(description="the most rollouts admitted at once (--max-pending)")
    stages: dict[Stage, StageStatus] = Field(description="each stage's pool: init, run, eval")
    live: dict[RolloutStatus, int] = Field(description="rollouts in flight, by status")
    finished: dict[TerminalStatus, int] = Field(description="since this server started")
    trajectories: TrajectoryCounters
    groups: GroupCounters = Field(description="over-sampling and the zero-variance filter")
    last_seq: int = Field(description="the newest result's cursor position")
    throughput_per_s: float = Field(description="rollouts finished per second, last minute")
    handlers: list[str] = Field(description="the data sources this server runs")
    recovered_at_start: Recovered
    nodes: list[NodeStatus] | None = Field(
        None, description="per Ray node (rollserve serve --ray); null on one machine"
    )


class ReapSummary(BaseModel):
    """What the start-up reaper cleaned up of a dead server's sandboxes."""

    sandboxes: int = Field(description="sandboxes found (owner records)")
    processes_killed: int = Field(description="their processes killed")
    kept_live_owners: int = Field(description="sandboxes of servers still running, left alone")
    errors: list[str] = Field(description="what could not be cleaned up")


class SandboxStatus(BaseModel):
    """The sandbox runtime. A runtime may report more of its own."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    runtime: str = Field(description="bubblewrap | apptainer | docker | local ...")
    ready: bool = Field(description="the runtime is made (it could run here)")
    error: str | None = Field(description="why it cannot run here")
    open: int = Field(description="sandboxes open now")
    started: int = Field(description="sandboxes started since start")
    limits: JSONObject | None = Field(
        description="the default limits and how this runtime enforces each one "
        "(``defaults``, ``enforced_by``); null until the runtime is made"
    )
    pool: JSONObject | None = Field(
        None,
        description="the warm pool (``--sandbox-pool``): capacity, ready, starting, "
        "hits, misses, started, trimmed, failed; null without one",
    )
    reaped_at_start: ReapSummary | None = Field(description="what the start-up reaper cleaned up (null before it ran)")


class JudgeState(BaseModel):
    """A judge (``rollserve serve --judge``): called at EVAL, never for the policy."""

    name: str = Field(description="the judge's name (a rubric's judges name it)")
    backend: JSONObject = Field(description="its backend, as the backend describes itself")
    concurrency: int = Field(description="calls in flight at most (later ones queue)")
    in_flight: int = Field(description="its calls in flight now")
    timeout: float = Field(description="seconds per try")
    retries: int = Field(description="more tries after a retryable failure")
    healthy: bool | None = Field(description="its last call answered; null before any")
    calls: dict[str, int] = Field(description="tries by outcome: ok, failed, timeout")
    unparsed: int = Field(
        0, description="samples whose replies held no valid score (scored as the scale's lowest, never masked)"
    )
    last_error: str | None = Field(description="its last failure, if any")


class ServiceStatus(EngineStatus):
    """``GET /v1/status``."""

    judges: list[JudgeState] = Field(
        default_factory=list, description="the judges (docs/judges.md), outside the router"
    )

    backends: list[BackendState] = Field(description="every inference backend, as the router sees it")
    llm: RouterStatus
    sandboxes: SandboxStatus = Field(description="the sandbox runtime")


class Health(BaseModel):
    """``GET /healthz``."""

    ok: bool = Field(description="the server answers")
    version: str = Field(description="rollserve's version")

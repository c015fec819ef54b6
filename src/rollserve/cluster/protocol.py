"""What the head and a node's worker send each other (pickled by Ray): a stage call,
its outcome, the batches they travel in (``LinkItem``, ``LinkReply``: ``cluster.link``),
the worker's settings and its status. No ray import here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollserve.agent import Trajectory
from rollserve.contract import Stage, Timeouts
from rollserve.engine.rollout import RolloutSpec
from rollserve.errors import AgentError, DeadlineFailure, InfraError, RolloutError, TimeoutFailure
from rollserve.llm.routing import RouterConfig

ErrorKind = Literal["infra", "agent", "timeout", "deadline", "bug"]


class RayConfig(BaseModel):
    address: str = Field(description="'auto' (the cluster this host belongs to) or the head's address, host:port")
    resource: str = Field(
        "rollserve",
        description="the Ray resource a node offers rollserve: "
        "a worker starts on each node that has it; its amount is the node's "
        "slots (rollouts hosted at once)",
    )
    poll_s: float = Field(1.0, gt=0, description="seconds between looks at the cluster's nodes")
    worker_start_timeout: float = Field(
        180.0, gt=0, description="seconds a node's worker may take to start (then it is tried again)"
    )
    call_timeout: float = Field(10.0, gt=0, description="seconds for a status or cleanup call")
    fence_after_polls: int = Field(
        3,
        ge=1,
        description="status polls in a row a node's worker "
        "may leave unanswered (each bounded by call_timeout) before "
        "the node is fenced: its worker killed, its rollouts run "
        "again elsewhere",
    )


class WorkerSettings(BaseModel):
    """What a node's worker builds its handlers, sandboxes and router from: the
    server's settings, as the head was started with them."""

    node: str = Field(description="the node's name (its owner records' folder)")
    state_dir: Path = Field(description="the server's state dir; the node's is <it>/nodes/<node>")
    tokenizer: str
    backends: list[str] = Field(default_factory=list)
    # The head router's changes since it started: removed names, added (spec, weight).
    removed_backends: list[str] = Field(default_factory=list)
    added_backends: list[tuple[str, float]] = Field(default_factory=list)
    llm: RouterConfig = Field(default_factory=RouterConfig)
    policy_version: int | None = None  # the head router's at the worker's start (then: resume)
    lora: str | None = None  # the LoRA adapter the head's policy is at the worker's start
    # The backends whose load of it failed on the head: not made to name it here.
    lora_failed: list[str] = Field(default_factory=list)
    scoring_workers: int = 2
    scoring_timeout: float = 10.0
    sandbox_runtime: str = "bubblewrap"
    sandbox_options: dict[str, Any] = Field(default_factory=dict)
    handler_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    harness_dir: str | None = None  # the head's harness install root (the same path on every node)
    seed_salt: str | None = None  # the head store's salt for generated instances' seeds
    orphan_grace: float = Field(
        60.0,
        gt=0,
        description="seconds past a hosted rollout's deadline (no stage running) before the worker cleans it up itself",
    )
    janitor_s: float = Field(5.0, gt=0, description="seconds between the worker's looks for those")

    @property
    def node_state_dir(self) -> Path:
        return self.state_dir / "nodes" / self.node


@dataclass
class StageCall:
    """One stage of one rollout attempt. Deadlines travel as seconds left when the head
    sent the call (each host's event-loop clock is its own)."""

    spec: RolloutSpec
    attempt: int
    stage: Stage
    max_turns: int
    max_context_tokens: int
    timeouts: Timeouts
    max_staleness: int | None
    mask_stale: bool
    rollout_left: float | None  # until the rollout's deadline
    calls_left: float | None  # until the earlier of the stage's and the rollout's
    run_left: float | None  # RUN only: until RUN must end
    # EVAL (the attempt's last stage): the worker cleans the attempt up as the stage ends,
    # before it answers, so the head sends no cleanup call of its own after it.
    release: bool = False


@dataclass
class StageError:
    """A stage's failure, as the head raises it again (``raise_again``)."""

    kind: ErrorKind
    message: str

    @classmethod
    def of(cls, exc: RolloutError) -> StageError:
        if isinstance(exc, DeadlineFailure):
            return cls("deadline", exc.message)
        return cls(exc.kind, exc.message)

    def raise_again(self) -> None:
        """The same typed failure the handler raised on the node (a handler's bug: an
        infra failure with its type and message, as the pipeline words it)."""
        error: RolloutError
        if self.kind == "deadline":
            error = DeadlineFailure(self.message)
        elif self.kind == "agent":
            error = AgentError(self.message)
        elif self.kind == "timeout":
            error = TimeoutFailure(self.message)
        else:
            error = InfraError(self.message)
        raise error


@dataclass
class StageOutcome:
    """What the head copies back into its rollout after a stage (or at cleanup)."""

    error: StageError | None = None
    trajectory: Trajectory | None = None
    reward: float | None = None
    evaluation: dict[str, Any] | None = None
    reward_components: dict[str, float] | None = None
    timing: dict[str, float] = field(default_factory=dict)  # the handler's keys (llm, tools...)
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class LinkItem:
    """One request of a batch the head sends a worker (``NodeWorker.exchange``): a stage
    to run, or an attempt to clean up (rollout id, attempt, whether to return what it
    produced). ``id`` is the head's, echoed in the reply."""

    id: int
    call: StageCall | None = None
    cleanup: tuple[str, int, bool] | None = None


@dataclass
class LinkReply:
    """A request's answer, as the head's exchange (``NodeWorker.exchange``) takes it: its
    ``StageOutcome`` (a stage; a cleanup's, or None), or the worker's failure to answer
    it (``error``). ``seq`` is the worker's count of replies: kept there until an
    exchange acknowledges it, so a lost answer is sent again."""

    seq: int
    id: int
    outcome: StageOutcome | None = None
    error: str | None = None


class WorkerReport(BaseModel):
    """A worker's own view of its node (``NodeWorker.status``)."""

    node: str
    pid: int
    hosted: int = Field(description="rollouts it holds between stages")
    running: int = Field(description="stage calls running now")
    sandboxes_open: int
    reaped_at_start: int = Field(description="sandboxes of a dead predecessor reaped at start")
    reap_errors: list[str] = Field(default_factory=list)

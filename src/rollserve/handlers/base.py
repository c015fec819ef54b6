"""The handler layer's contracts: a task family (``AgentHandler``), what the engine
lends it (``HandlerContext``) and what it sees of a rollout (``RolloutView``).

A handler is one class per task family, registered under its data_source name (see
``registry``). The engine drives each rollout through its stages: ``init`` (sandbox
up, task ready), ``run`` (the agent loop fills ``rollout.trajectory``), ``eval`` (the
reward), and always ``cleanup``. What one stage hands to the next is the handler's
own typed state, a dataclass it puts on ``rollout.state`` and reads back with
``AgentHandler.state(rollout, Kind)``; sandboxes and tools it opens go into
``rollout.resources`` (``handlers.sandboxed``), which ``cleanup`` releases.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from rollserve.contract.judge import JudgeRequest, Rubric
from rollserve.errors import InfraError

if TYPE_CHECKING:  # (annotations only: importing the contracts stays cheap)
    from rollserve.agent import Trajectory
    from rollserve.agent.base import Tool
    from rollserve.agent.gateway import Gateway
    from rollserve.contract import SamplingParams
    from rollserve.handlers.judging import JudgePool
    from rollserve.handlers.scoring import ScoringPool
    from rollserve.llm.base import LLMSession, Tokenizer
    from rollserve.sandbox.base import Sandbox, SandboxStarter

StateT = TypeVar("StateT")


class HandlerDefaults(BaseModel):
    """Limits a handler uses when a request leaves them unset."""

    max_turns: int = 3
    max_context_tokens: int = 2048
    init_timeout: float = 60.0
    run_timeout: float = 600.0
    eval_timeout: float = 60.0
    total_timeout: float = 1800.0


@dataclass
class Evaluation:
    """A handler's score: the scalar ``reward``, its ``details`` (JSON) and named
    ``components`` (the result's ``reward_components``: correctness, format, tests
    passed, judge...; empty when the handler has none)."""

    reward: float
    details: dict[str, Any] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)

    def reward_components(self) -> dict[str, float] | None:
        """``components`` as a result carries them: floats, None when there are none."""
        return {name: float(value) for name, value in self.components.items()} or None


@dataclass(frozen=True)
class FirstPrompt:
    """The least an instance's first model call takes (a harness's system prompt and
    tools, as its preset measured them): the engine refuses at submit a rollout whose
    context window cannot hold it (``AgentHandler.first_prompt``)."""

    field: str  # the instance's field that chose it, e.g. instance.harness.preset
    tokens: int
    what: str  # who sends it, for the refusal: "codex's first prompt"
    measured: str = ""  # how it was counted (tokenizers), for the refusal


class InvalidInstance(ValueError):
    """A task instance does not fit its handler; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class HandlerContext:
    """What the engine lends every handler.

    ``sandboxes`` starts sandboxes (``await ctx.sandboxes.start(spec)``): the server's
    runtime, created on first use (``sandbox.registry.LazyRuntime``), or None where
    the server has none. A handler that needs one and cannot get it fails the
    rollout with a ``SandboxError`` (infra: masked). Every sandbox a handler starts
    must be closed in its ``cleanup`` (``handlers.sandboxed`` does both).
    """

    tokenizer: Tokenizer
    scoring: ScoringPool
    sandboxes: SandboxStarter | None = None
    # Per-handler settings from the server (``rollserve serve --handler-options``):
    # handler name -> its options; each handler validates its own.
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The server's recording gateway (``agent.gateway``): where a harness-driven
    # rollout registers its session; None where the server has none.
    gateway: Gateway | None = None
    # The store's salt for the seeds of generated instances (``handlers.seeds``):
    # None where the server uses the public seeds as they are (``public_seeds``).
    # Never shown to a policy.
    seed_salt: str | None = None
    # Where harness presets are installed (``rollserve harness install``; the server's
    # ``--harness-dir``): None is ``agent.harnesses.install.install_root()``'s default
    # (``$ROLLSERVE_HARNESS_DIR``, else ``~/.cache/rollserve/harnesses``).
    harness_dir: str | None = None
    # The server's judges (``llm.judges.Judges``: ``--judge``), called at EVAL for a
    # task that asks for a judge reward; None where the server has none.
    judges: JudgePool | None = None
    # Named rubrics (``--rubric NAME=JSON``) beside the built-in ``default``.
    rubrics: dict[str, Rubric] = field(default_factory=dict)
    # The judge reward a task gets when neither it nor its batch asks for one
    # (``--default-judge RUBRIC``); None: the family's outcome alone.
    default_judge: JudgeRequest | None = None

    def rubric(self, request: JudgeRequest) -> Rubric:
        """The rubric ``request`` names (or holds); KeyError when the server has none
        of that name."""
        if isinstance(request.rubric, Rubric):
            return request.rubric
        if request.rubric in self.rubrics:
            return self.rubrics[request.rubric]
        if request.rubric == "default":
            return Rubric()
        raise KeyError(request.rubric)

    def judge_problem(self, request: JudgeRequest) -> tuple[str, str] | None:
        """Why this server cannot give ``request``'s judge reward: (field, message)."""
        try:
            rubric = self.rubric(request)
        except KeyError:
            known = ", ".join(sorted({"default", *self.rubrics}))
            return "rubric", f"no rubric named {request.rubric!r} here (known: {known})"
        names = self.judges.names() if self.judges is not None else []
        if not names:
            return "rubric", "this server has no judge (rollserve serve --judge NAME=URL)"
        unknown = [n for n in rubric.judges if n not in names]
        if unknown:
            return "rubric.judges", (f"no judge named {unknown[0]!r} here (known: {', '.join(names)})")
        return None


@dataclass
class RolloutResources:
    """What a rollout holds that its handler's ``cleanup`` must release: the sandboxes
    it started, and tools (shells, kernels) to end before them."""

    sandboxes: list[Sandbox] = field(default_factory=list)
    closers: list[Tool] = field(default_factory=list)


@runtime_checkable
class RolloutView(Protocol):
    """What a handler sees of a rollout (the engine's ``Rollout`` is one)."""

    # The handler's own typed state: what one stage hands the next (None until the
    # handler sets it; read it back with ``AgentHandler.state``).
    state: object | None

    @property
    def id(self) -> str: ...

    @property
    def instance(self) -> Mapping[str, Any]:
        """The task instance, as submitted (validated by the handler at submission):
        read-only, as the engine stores and replays it. A family with a typed model of
        its instance reads it through that (swe's ``SWETask``, the gateway's
        ``GatewayInstance``, stem's ``StemQuestion``)."""
        ...

    @property
    def metadata(self) -> dict[str, Any]:
        """The client's metadata for the task, returned with the result."""
        ...

    @property
    def judge(self) -> JudgeRequest | None:
        """The judge reward the task asks for on top of its family's outcome (None:
        the outcome alone); ``handlers.base.evaluate`` applies it."""
        ...

    @property
    def sampling(self) -> SamplingParams: ...

    @property
    def max_turns(self) -> int: ...

    @property
    def max_context_tokens(self) -> int: ...

    @property
    def deadline(self) -> float | None:
        """Event-loop time (``loop.time()``) by which the whole rollout must end."""
        ...

    def agent_deadline(self, now: float) -> float | None:
        """Event-loop time at which the agent's episode ends itself (``agent.clock``), so
        that RUN ends in time; None when there is none (outside an engine's RUN)."""
        ...

    @property
    def trajectory(self) -> Trajectory:
        """Filled in place by the agent loop (``handlers.episode.run_episode``)."""
        ...

    @property
    def llm(self) -> LLMSession | None:
        """The rollout's sticky LLM session, set by the engine before RUN."""
        ...

    @property
    def resources(self) -> RolloutResources: ...

    def add_time(self, key: str, seconds: float) -> None:
        """Add ``seconds`` to the result's ``timing[key]``."""

    def add_stats(self, counts: Mapping[str, int]) -> None:
        """Set these counts in the result's ``stats`` (tool calls, errors...)."""


class AgentHandler(ABC):
    """A task family: subclass it, set ``name`` and ``defaults``, implement the stages.

    The engine builds one instance per server (``Handler(ctx)``) and calls its stages
    concurrently for many rollouts, so per-rollout data lives on the rollout, never on
    the handler: a stage puts what the next one needs on ``rollout.state`` (a
    dataclass of the handler's own) and the next reads it back with ``state``.
    """

    name: ClassVar[str]  # the data_source it is registered under
    defaults: ClassVar[HandlerDefaults] = HandlerDefaults()

    def __init__(self, ctx: HandlerContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def validate(self, instance: Mapping[str, Any]) -> None:
        """Raise InvalidInstance naming the field if ``instance`` cannot run."""

    def outside_harness(self, instance: Mapping[str, Any]) -> str | None:
        """The instance's field that, unset, leaves its harness outside the sandbox,
        calling this server's ``/v1/gateway`` routes (a cluster node's gateway sessions
        are not reachable there); None: the rollout can run on any node."""
        return None

    def first_prompt(self, instance: Mapping[str, Any]) -> FirstPrompt | None:
        """The least ``instance``'s first prompt takes, where the handler knows it in
        advance (a harness preset's ``[prompt]``), for the engine's check at submit
        against the rollout's context window; None: not known. Called after
        ``validate``."""
        return None

    @abstractmethod
    async def init(self, rollout: RolloutView) -> None:
        """Prepare the task (sandbox up, data ready)."""

    @abstractmethod
    async def run(self, rollout: RolloutView) -> None:
        """The agent loop; fills ``rollout.trajectory``."""

    @abstractmethod
    async def eval(self, rollout: RolloutView) -> Evaluation:
        """Score the episode."""

    @abstractmethod
    async def cleanup(self, rollout: RolloutView) -> None:
        """Release everything ``init``/``run`` took; always called, even on cancel."""

    def rescore_problem(self, instance: Mapping[str, Any]) -> str | None:
        """Why a stored result of ``instance`` cannot be scored again from what the
        result keeps (its messages) by ``init`` then ``evaluate`` (None: it can). By
        default a family cannot: its EVAL needs what only its run had."""
        return (
            f"the {self.name} family's EVAL needs what only its run had (a sandbox, a "
            "harness's session, files written): it cannot be re-scored from a stored result"
        )

    #: Whether re-scoring reads the stored messages (one conversation): a family that
    #: scores from what its evaluation kept (swe: the candidate patch) says False.
    rescores_from_messages = True

    def rescore_result_problem(self, evaluation: Mapping[str, Any] | None) -> str | None:
        """Why the stored result whose evaluation is ``evaluation`` (None: its EVAL never
        ended, e.g. an infra failure, masked) lacks what ``restore`` needs (None: fine)."""
        return None

    async def restore(self, rollout: RolloutView, evaluation: Mapping[str, Any] | None) -> None:
        """Set up ``rollout`` (its stored messages already on its trajectory) for EVAL
        again from a stored result; by default ``init``, as EVAL reads the messages."""
        await self.init(rollout)

    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        """The task's text a judge is shown, from the stored instance (the trainer's,
        never the policy's); None where the family has none: the judge is then shown the
        first user message as policy-influenced text, delimited like the answer."""
        return None

    def images(self, instance: Mapping[str, Any]) -> list[str]:
        """The environment images (apptainer / docker references) ``instance`` runs
        in, for ``rollserve images pull``; none by default."""
        return []

    def state(self, rollout: RolloutView, kind: type[StateT]) -> StateT:
        """The ``kind`` an earlier stage put on ``rollout.state``; an InfraError (the
        rollout is masked, not scored) when there is none, as when RUN comes before
        INIT."""
        state = rollout.state
        if isinstance(state, kind):
            return state
        found = "nothing" if state is None else f"a {type(state).__name__}"
        raise InfraError(
            f"{self.name} handler: rollout {rollout.id} has no {kind.__name__} "
            f"(found {found}): its stages ran out of order, e.g. RUN before INIT"
        )


async def evaluate(handler: AgentHandler, rollout: RolloutView) -> Evaluation:
    """What the engine calls at EVAL: the handler's ``eval`` (the family's outcome), then
    the task's judge reward when it asks for one (``handlers.judging``)."""
    return await judge_evaluation(handler, rollout, await handler.eval(rollout))


async def judge_evaluation(handler: AgentHandler, rollout: RolloutView, evaluation: Evaluation) -> Evaluation:
    """``evaluation`` (the family's outcome) with the task's judge reward when it asks
    for one (``handlers.judging``), by ``handler.ctx``'s judges: apart from ``evaluate``
    for a cluster's head, which judges what a node's EVAL gave (the nodes have none)."""
    judge = getattr(rollout, "judge", None)  # (a view from before judges has none)
    if judge is None:
        return evaluation
    from rollserve.handlers.judging import judged  # (only where a task asks)

    try:
        task = handler.judge_task(rollout.instance)
    except (InvalidInstance, KeyError, TypeError, ValueError):
        task = None  # shown as policy-influenced text instead
    return await judged(handler.ctx, evaluation, rollout.trajectory.messages, rollout.instance, judge, task)

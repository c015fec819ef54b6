"""The result of one rollout: what a trainer trains on, and how it ended.

Every rollout ends as one ``RolloutResult``. Its ``trajectory`` is one append-only
token sequence (``tokens``: prompt tokens with loss_mask 0 and logprob 0.0, interleaved
with the tokens the policy sampled, loss_mask 1 and their logprobs verbatim), the same
conversation per turn (``turns``) and as chat messages (``messages``). ``tokens`` is
always exactly the turns laid end to end: each turn's ``prompt_ids_delta`` then its
``output_ids``.

A harness driving the policy through the gateway may rewrite its own history
(truncate it, summarise it, edit an earlier message). Its trajectory is then several
append-only sequences (``sequence_count`` > 1): ``sequences`` holds each one, laid
out as ``tokens`` is (the turns whose ``sequence`` is its index, end to end), and
``tokens`` itself is empty, so a trainer that reads only ``tokens`` never trains on
tokens glued together from different contexts.

A harness may also make auxiliary model calls (a title, a "small fast model", a
sub-agent on another model: ``contract.calls.GatewayCalls`` says which calls are
auxiliary). Each is in ``auxiliary``, one ``AuxiliaryCall`` per call with its own
sequence and its ``purpose`` and ``model`` asked, never in ``turns``, ``tokens`` or
``sequences``: the reward judges the main loop, so a trainer trains on
``tokens``/``sequences`` and leaves ``auxiliary`` out unless it decides otherwise.

``mask: true`` means do not train on it: an infrastructure failure, a timeout, an
interruption, or (when the server masks them) turns sampled by policy versions too
far apart. The agent's own failures are not masked: they are scored (reward 0).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from rollserve.contract.requests import JSONObject

TerminalStatus = Literal["completed", "failed", "cancelled", "timed_out", "interrupted"]
Stage = Literal["init", "run", "eval"]
RolloutStatus = Literal["queued", "init", "run", "eval", "completed", "failed", "cancelled", "timed_out", "interrupted"]
FailureKind = Literal["infra", "agent", "timeout"]
FailureStage = Literal["queue", "init", "run", "eval"]

TERMINAL: frozenset[str] = frozenset(get_args(TerminalStatus))
STAGES: tuple[Stage, ...] = get_args(Stage)
ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = get_args(RolloutStatus)


class ToolCall(BaseModel):
    """A tool call the policy made in one turn, as the environment parsed it."""

    name: str = Field(description="the tool called")
    arguments: JSONObject | str = Field(
        description="the arguments as parsed (an object), or the raw text when they were "
        "not valid JSON (a message-level backend's string, say)"
    )
    id: str | None = Field(None, description="the call's id, when a chat API gave one")


class Turn(BaseModel):
    """One assistant turn: the prompt tokens added for it, then what the policy sampled."""

    prompt_ids_delta: list[int] = Field(
        description="prompt token ids added since the previous turn's output (the whole "
        "opening prompt for the first turn)"
    )
    output_ids: list[int] = Field(description="the ids the policy sampled, verbatim")
    logprobs: list[float] = Field(description="the logprob of each sampled id, verbatim")
    finish_reason: str = Field(description="stop | length (cut by max_tokens) | abort | tool_calls (a chat API's) ...")
    backend: str = Field(description="the inference backend that sampled it")
    policy_version: int | None = Field(
        None, description="the policy version the router stamped when it sent the call (POST /v1/llm/resume sets it)"
    )
    tool_calls: list[ToolCall] = Field(default_factory=list, description="the tool calls this turn made, as parsed")
    sequence: int = Field(
        0,
        ge=0,
        description="the token sequence the turn belongs to: 0, unless a harness "
        "rewrote its history (see Trajectory.sequences)",
    )

    @model_validator(mode="after")
    def _one_logprob_per_id(self) -> Turn:
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.output_ids)} output_ids but {len(self.logprobs)} logprobs: they must have the same length"
            )
        return self


class Tokens(BaseModel):
    """The whole episode as one sequence, ready to train on."""

    input_ids: list[int] = Field(description="every token of the episode, in order")
    loss_mask: list[Annotated[int, Field(ge=0, le=1)]] = Field(
        description="1 exactly on the tokens the policy sampled, 0 on prompt tokens"
    )
    logprobs: list[float] = Field(description="the sampled tokens' logprobs, verbatim; 0.0 on prompt tokens")

    @model_validator(mode="after")
    def _same_length(self) -> Tokens:
        lengths = {len(self.input_ids), len(self.loss_mask), len(self.logprobs)}
        if len(lengths) != 1:
            raise ValueError(
                f"input_ids, loss_mask and logprobs must have the same length; "
                f"got {len(self.input_ids)}, {len(self.loss_mask)} and "
                f"{len(self.logprobs)}"
            )
        return self


class AuxiliaryCall(BaseModel):
    """One auxiliary model call of a harness (not its agent's main loop), in a sequence
    of its own: its whole prompt (``turn.prompt_ids_delta``), then what the policy sampled."""

    purpose: str = Field(
        description="why the harness called: the purpose its preset (or "
        "instance.calls) gives the model asked, else 'auxiliary'"
    )
    model: str = Field(description="the model name the call asked for")
    turn: Turn = Field(description="the call as a turn (sequence 0 of its own)")
    tokens: Tokens = Field(
        description="the call's prompt then its sampled ids: loss_mask 1 exactly on the "
        "sampled ids. Not part of the episode the reward judges: train on it "
        "only by choice"
    )

    @model_validator(mode="after")
    def _tokens_are_the_turn(self) -> AuxiliaryCall:
        if self.tokens.input_ids != self.turn.prompt_ids_delta + self.turn.output_ids:
            raise ValueError("an auxiliary call's tokens must be its turn's prompt then its output ids")
        return self


class Fidelity(BaseModel):
    """Whether the token sequence is exactly what the chat template renders."""

    append_only: bool = Field(
        True,
        description="each prompt is the previous one plus new tokens (false on a "
        "message-level backend: it has no token ids)",
    )
    template_checked: bool = Field(
        False, description="the final sequence was compared with a fresh render of the conversation"
    )
    mismatches: int = Field(0, description="tokens where the two differed")
    first_mismatch: int | None = Field(None, description="the position of the first of them")
    fallback_deltas: int = Field(0, description="prompt deltas built from a probe conversation, not the real one")


class ChatMessage(BaseModel):
    """A chat message, in the OpenAI chat format. Other keys a message carries (``name``,
    ``tool_call_id``, a chat API's ``tool_calls``) are kept as they are."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    role: str = Field(description="system | user | assistant | tool ...")
    content: str | list[JSONObject] | None = Field(None, description="the text (or a chat API's content parts)")


class Trajectory(BaseModel):
    """The conversation of one episode, as tokens, turns and messages."""

    messages: list[ChatMessage] = Field(description="the chat view of the episode")
    turns: list[Turn] = Field(description="one entry per assistant turn sampled")
    tokens: Tokens = Field(
        description="the turns laid end to end; empty when the trajectory has several sequences (see sequences)"
    )
    sequence_count: int = Field(
        1,
        ge=1,
        description="how many append-only token sequences the trajectory is: 1, "
        "or more when a harness rewrote its history through the gateway",
    )
    sequences: list[Tokens] = Field(
        default_factory=list,
        description="empty when sequence_count is 1 (tokens holds the sequence); else one "
        "entry per sequence, each the turns of that sequence laid end to end",
    )
    fidelity: Fidelity
    policy_versions: list[int] = Field(description="the distinct policy versions that sampled the turns, ascending")
    trainable: bool = Field(description="false on a message-level backend: no token ids, nothing to train on")
    # A string, not a Literal: a newer server may end episodes for a new reason, and a
    # client that validates results with an older copy of this model must still read
    # them. The server's own values are ``rollserve.agent.base.EndedBy``.
    ended_by: str | None = Field(
        description="finished | no_tool_call | max_turns | context_exhausted | time_limit "
        "(a client accepts a reason it does not know: later versions may add "
        "some); null when the agent loop never ended (a failure)"
    )
    tools: list[JSONObject] | None = Field(description="the tools the agent was offered (ChatCompletion format)")
    auxiliary: list[AuxiliaryCall] = Field(
        default_factory=list,
        description="a harness's auxiliary model calls (titles, a small fast model...), in "
        "order, each in its own sequence with its purpose and the model asked; "
        "not in turns, tokens or sequences, and not judged by the reward",
    )

    @model_validator(mode="after")
    def _sequences_agree(self) -> Trajectory:
        if not self.sequences:
            if self.sequence_count != 1:
                raise ValueError(
                    f"sequence_count is {self.sequence_count} but sequences is "
                    "empty: a single-sequence trajectory has sequence_count 1"
                )
            return self
        if len(self.sequences) < 2 or len(self.sequences) != self.sequence_count:
            raise ValueError(
                f"sequence_count is {self.sequence_count} and sequences has "
                f"{len(self.sequences)} entries: several sequences (2 or more) "
                "are listed in sequences, one sequence in tokens"
            )
        if self.tokens.input_ids:
            raise ValueError("tokens must be empty when the trajectory has several sequences")
        if any(t.sequence >= self.sequence_count for t in self.turns):
            raise ValueError("a turn names a sequence past sequence_count")
        return self


class Failure(BaseModel):
    """How a rollout failed."""

    stage: FailureStage = Field(description="where: queue | init | run | eval")
    kind: FailureKind = Field(
        description="infra: something outside the agent broke (masked, never scored); "
        "agent: the agent's own failure (scored); timeout: a bounded wait ran "
        "out (masked)"
    )
    message: str = Field(description="what happened, in one line")


class Timing(BaseModel):
    """Seconds spent, by stage; 0 for a stage the rollout never reached. Handlers add
    keys of their own (the built-in ones: ``llm``, ``tools``)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float] = Field(init=False)

    queued: float = Field(0.0, description="waiting for stage slots, all stages together")
    queued_init: float = Field(0.0, description="waiting for an INIT slot")
    queued_run: float = Field(0.0, description="waiting for a RUN slot")
    queued_eval: float = Field(0.0, description="waiting for an EVAL slot")
    init: float = Field(0.0, description="the INIT stage")
    run: float = Field(0.0, description="the RUN stage (the agent loop)")
    eval: float = Field(0.0, description="the EVAL stage (scoring)")
    total: float = Field(0.0, description="the whole rollout")


class Stats(BaseModel):
    """Counts over the trajectory. Handlers add counts of their own (the tool-using
    ones: ``tool_calls``, ``tool_errors``, ``tool_parse_errors``, ``tool_timeouts``)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, int] = Field(init=False)

    turns: int = Field(description="assistant turns sampled")
    prompt_tokens: int = Field(description="prompt tokens in the sequence")
    output_tokens: int = Field(description="sampled tokens in the sequence")
    truncated_turns: int = Field(description="turns cut by max_tokens (finish_reason length)")


class RolloutResult(BaseModel):
    """One finished rollout."""

    id: str = Field(description="the rollout's id")
    group_id: str = Field(description="its group: the n samples of one task")
    task_id: str = Field(description="the task's client-chosen id, else the group id")
    data_source: str = Field(description="the handler that ran it")
    sample_index: int = Field(description="0..n-1 within its group")
    status: TerminalStatus = Field(
        description="completed | failed | cancelled | timed_out | interrupted (the server stopped under it)"
    )
    reward: float | None = Field(
        description="the handler's score; 0.0 on an agent failure; null when nothing was "
        "scored (an infra failure, a timeout...)"
    )
    evaluation: JSONObject | None = Field(
        description="the handler's details of the score (extracted answer, tests run...)"
    )
    reward_components: dict[str, float] | None = Field(
        None,
        description="named parts of the score beside the scalar reward (correctness, "
        "format, tests passed, a Harbor task's reward.json, judge...), for "
        "per-objective normalisation; null when the handler gave none (or "
        "nothing was scored)",
    )
    failure: Failure | None = Field(description="null when the rollout completed")
    mask: bool = Field(description="true: do not train on this (see mask_reason)")
    mask_reason: str | None = Field(description="why it is masked")
    stale: bool = Field(description="its turns span more policy versions than the server's max_staleness")
    trajectory: Trajectory
    timing: Timing
    stats: Stats
    attempt: int = Field(description="1, or more when a restart ran it again")
    metadata: JSONObject = Field(description="the task's metadata, as submitted")
    seq: int | None = Field(
        None, description="its position in the results cursor (GET /v1/results?after=); null until the result is stored"
    )
    scoring: str | None = Field(
        None,
        description="how it was scored: null for the family's own EVAL as it ran; "
        "'outcome' or 'judge:<rubric>' for a re-scored result",
    )
    rescored_from: str | None = Field(
        None,
        description="the stored result this one re-scores (POST /v1/results/rescore): "
        "same trajectory, a new evaluation; null for a sampled rollout",
    )

"""The token-level trajectory a trainer trains on.

One append-only sequence: prompt tokens (loss_mask 0, logprob 0.0) interleaved with
the tokens the policy sampled (loss_mask 1, their logprobs verbatim), plus the
per-turn view and the chat view of the same conversation.

The result's ``tokens`` are always exactly the turns laid end to end (each turn's
``prompt_ids_delta`` then its ``output_ids``): a prompt delta added for a turn that
was never sampled (the episode failed or was cut before it) is left out of both.

A harness behind the gateway may rewrite its history; ``start_sequence`` then closes
the sequence so far and opens a new one (each append-only within itself; each turn
records which one it belongs to), and the result lists them in ``sequences``.

A harness's auxiliary calls (``contract.calls.GatewayCalls``) are kept apart in
``auxiliary``, each a turn in a sequence of its own: never in ``turns`` or the
sequences above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollserve import contract
from rollserve.agent.base import EndedBy, ToolCallRecord
from rollserve.llm.base import Fidelity, Generation


@dataclass
class Turn:
    prompt_ids_delta: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    backend: str
    policy_version: int | None = None
    # The tool calls the environment read in this turn's reply (a chat API's own
    # calls on a message-level backend), each {"name", "arguments", "id"}.
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    sequence: int = 0  # the token sequence it belongs to (``Trajectory.start_sequence``)


@dataclass
class AuxiliaryTurn:
    """An auxiliary call: its purpose, the model asked, and the call as a turn whose
    ``prompt_ids_delta`` is its whole prompt (a sequence of its own)."""

    purpose: str
    model: str
    turn: Turn


@dataclass
class TokenSequence:
    """A closed sequence of a multi-sequence trajectory."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


@dataclass
class Trajectory:
    # The chat view (the result's ``messages``): the agent loop's own ``Message`` list,
    # or the messages a harness sent through the gateway as it sent them (their content
    # may be a chat API's parts). Read only: the one who set it appends to it.
    messages: Sequence[Mapping[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    fidelity: Fidelity = field(default_factory=Fidelity)
    trainable: bool = True
    ended_by: EndedBy | None = None  # None: the episode never ended (it failed)
    tools: list[dict[str, Any]] | None = None  # the tools the agent was offered (ChatCompletion shape)
    closed: list[TokenSequence] = field(default_factory=list)  # earlier sequences
    auxiliary: list[AuxiliaryTurn] = field(default_factory=list)  # never in turns or sequences
    _pending_prompt: list[int] = field(default_factory=list)

    @property
    def sequence(self) -> int:
        """The index of the sequence turns are added to now."""
        return len(self.closed)

    def start_sequence(self) -> None:
        """Close the current sequence (without a trailing prompt no turn was sampled
        after) and start an empty one; a sequence without turns is dropped instead."""
        end = self.sampled_length
        if any(t.sequence == self.sequence for t in self.turns):
            self.closed.append(TokenSequence(self.input_ids[:end], self.loss_mask[:end], self.logprobs[:end]))
        self.input_ids, self.loss_mask, self.logprobs = [], [], []
        self._pending_prompt = []

    def add_prompt(self, ids: list[int]) -> None:
        self.input_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self._pending_prompt.extend(ids)

    def add_generation(self, gen: Generation, policy_version: int | None = None) -> Turn:
        self.input_ids.extend(gen.output_ids)
        self.loss_mask.extend([1] * len(gen.output_ids))
        self.logprobs.extend(gen.logprobs)
        turn = Turn(
            prompt_ids_delta=self._pending_prompt,
            output_ids=list(gen.output_ids),
            logprobs=list(gen.logprobs),
            finish_reason=gen.finish_reason,
            backend=gen.backend,
            policy_version=policy_version,
            sequence=self.sequence,
        )
        self._pending_prompt = []
        self.turns.append(turn)
        return turn

    @property
    def sampled_length(self) -> int:
        """Length of the sequence the turns hold: without a trailing prompt delta that
        no turn was sampled after."""
        return len(self.input_ids) - len(self._pending_prompt)

    @property
    def prompt_tokens(self) -> int:
        closed = sum(len(s.input_ids) for s in self.closed)
        return closed + self.sampled_length - self.output_tokens

    @property
    def output_tokens(self) -> int:
        return sum(len(t.output_ids) for t in self.turns)

    @property
    def policy_versions(self) -> list[int]:
        """The distinct policy versions that produced this trajectory's turns."""
        return sorted({t.policy_version for t in self.turns if t.policy_version is not None})

    @property
    def truncated_turns(self) -> int:
        """Turns cut by their token limit (finish_reason "length")."""
        return sum(1 for t in self.turns if t.finish_reason == "length")

    def to_wire(self) -> contract.Trajectory:
        """The trajectory as results carry it (``rollserve.contract.Trajectory``)."""
        end = self.sampled_length
        current = contract.Tokens(
            input_ids=self.input_ids[:end], loss_mask=self.loss_mask[:end], logprobs=self.logprobs[:end]
        )
        sequences = [
            contract.Tokens(input_ids=s.input_ids, loss_mask=s.loss_mask, logprobs=s.logprobs) for s in self.closed
        ]
        if sequences and any(t.sequence == self.sequence for t in self.turns):
            sequences.append(current)
        if len(sequences) == 1:  # the later sequences were never sampled in
            current, sequences = sequences[0], []
        return contract.Trajectory(
            messages=[contract.ChatMessage.model_validate(m) for m in self.messages],
            turns=[_wire_turn(t) for t in self.turns],
            tokens=contract.Tokens(input_ids=[], loss_mask=[], logprobs=[]) if sequences else current,
            sequence_count=max(1, len(sequences)),
            sequences=sequences,
            fidelity=contract.Fidelity.model_validate(self.fidelity, from_attributes=True),
            policy_versions=self.policy_versions,
            trainable=self.trainable,
            ended_by=self.ended_by,
            tools=self.tools,
            auxiliary=[_wire_auxiliary(a) for a in self.auxiliary],
        )


def _wire_turn(t: Turn) -> contract.Turn:
    return contract.Turn(
        prompt_ids_delta=t.prompt_ids_delta,
        output_ids=t.output_ids,
        logprobs=t.logprobs,
        finish_reason=t.finish_reason,
        backend=t.backend,
        policy_version=t.policy_version,
        tool_calls=[contract.ToolCall.model_validate(c) for c in t.tool_calls],
        sequence=t.sequence,
    )


def _wire_auxiliary(call: AuxiliaryTurn) -> contract.AuxiliaryCall:
    turn = call.turn
    prompt, output = turn.prompt_ids_delta, turn.output_ids
    return contract.AuxiliaryCall(
        purpose=call.purpose,
        model=call.model,
        turn=_wire_turn(turn),
        tokens=contract.Tokens(
            input_ids=prompt + output,
            loss_mask=[0] * len(prompt) + [1] * len(output),
            logprobs=[0.0] * len(prompt) + turn.logprobs,
        ),
    )

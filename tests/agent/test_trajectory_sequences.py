"""A trajectory of several token sequences (a gateway harness rewrote its history): the
agent's ``Trajectory`` and the contract's, and that single-sequence results keep their
shape (results stored before sequences existed still validate)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollserve import contract
from rollserve.agent.trajectory import Trajectory
from rollserve.llm.base import Generation


def sampled(trajectory: Trajectory, prompt: list[int], output: list[int]) -> None:
    trajectory.add_prompt(prompt)
    trajectory.add_generation(Generation(output, [-0.5] * len(output), "stop"))


def test_single_sequence_results_are_unchanged():
    trajectory = Trajectory()
    sampled(trajectory, [1, 2], [3])
    sampled(trajectory, [4], [5, 6])
    wire = trajectory.to_wire()
    assert wire.sequence_count == 1 and wire.sequences == []
    assert wire.tokens.input_ids == [1, 2, 3, 4, 5, 6]
    assert wire.tokens.loss_mask == [0, 0, 1, 0, 1, 1]
    assert [t.sequence for t in wire.turns] == [0, 0]
    # A result stored before sequences existed has neither field: it still validates.
    old = wire.model_dump()
    for key in ("sequence_count", "sequences"):
        old.pop(key)
    for turn in old["turns"]:
        turn.pop("sequence")
    assert contract.Trajectory.model_validate(old) == wire


def test_a_new_sequence_keeps_each_exact_and_tokens_empty():
    trajectory = Trajectory()
    sampled(trajectory, [1, 2], [3])
    trajectory.add_prompt([9, 9])  # a delta never sampled after: not part of the sequence
    trajectory.start_sequence()
    sampled(trajectory, [7], [8, 8])
    trajectory.add_prompt([5])  # nor here
    wire = trajectory.to_wire()
    assert wire.sequence_count == 2 and wire.tokens.input_ids == []
    first, second = wire.sequences
    assert (first.input_ids, first.loss_mask) == ([1, 2, 3], [0, 0, 1])
    assert (second.input_ids, second.loss_mask, second.logprobs) == ([7, 8, 8], [0, 1, 1], [0.0, -0.5, -0.5])
    assert [t.sequence for t in wire.turns] == [0, 1]
    assert trajectory.prompt_tokens == 3 and trajectory.output_tokens == 3


def test_a_sequence_without_turns_is_dropped():
    trajectory = Trajectory()
    trajectory.add_prompt([1, 2])
    trajectory.start_sequence()  # nothing was sampled in the first: it is not kept
    sampled(trajectory, [3], [4])
    wire = trajectory.to_wire()
    assert wire.sequence_count == 1 and wire.tokens.input_ids == [3, 4]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sequence_count": 2}, "sequences is empty"),
        ({"sequences": [{"input_ids": [1], "loss_mask": [1], "logprobs": [0.0]}]}, "2 or more"),
        (
            {"sequence_count": 3, "sequences": [{"input_ids": [1], "loss_mask": [1], "logprobs": [0.0]}] * 2},
            "2 or more",
        ),
    ],
)
def test_the_contract_refuses_sequences_that_disagree(change, message):
    trajectory = Trajectory()
    sampled(trajectory, [1], [2])
    body = {**trajectory.to_wire().model_dump(), **change}
    with pytest.raises(ValidationError, match=message):
        contract.Trajectory.model_validate(body)


def test_the_contract_refuses_tokens_beside_several_sequences():
    trajectory = Trajectory()
    sampled(trajectory, [1], [2])
    trajectory.start_sequence()
    sampled(trajectory, [3], [4])
    body = trajectory.to_wire().model_dump()
    body["tokens"] = body["sequences"][0]
    with pytest.raises(ValidationError, match="tokens must be empty"):
        contract.Trajectory.model_validate(body)

"""Auxiliary calls in the result: each its own sequence, apart from the main loop's,
and the contract holds its tokens to its turn; ``GatewayCalls`` says which is which."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollserve.agent.trajectory import AuxiliaryTurn, Trajectory, Turn
from rollserve.contract import AuxiliaryCall, GatewayCalls, RolloutResult
from rollserve.llm.base import Generation


def test_auxiliary_calls_are_kept_out_of_the_main_sequence():
    trajectory = Trajectory()
    trajectory.add_prompt([1, 2, 3])
    trajectory.add_generation(Generation(output_ids=[4, 5], logprobs=[-0.5, -0.25], finish_reason="stop", backend="b"))
    trajectory.auxiliary.append(
        AuxiliaryTurn(
            "small_fast_model",
            "small",
            Turn(prompt_ids_delta=[7, 8], output_ids=[9], logprobs=[-1.5], finish_reason="stop", backend="b"),
        )
    )
    wire = trajectory.to_wire()
    assert wire.tokens.input_ids == [1, 2, 3, 4, 5] and wire.sequence_count == 1
    assert len(wire.turns) == 1
    (aux,) = wire.auxiliary
    assert (aux.purpose, aux.model) == ("small_fast_model", "small")
    assert aux.tokens.input_ids == [7, 8, 9] and aux.tokens.loss_mask == [0, 0, 1]
    assert aux.tokens.logprobs == [0.0, 0.0, -1.5]


def test_an_auxiliary_calls_tokens_must_be_its_turn():
    turn = {"prompt_ids_delta": [1], "output_ids": [2], "logprobs": [-0.5], "finish_reason": "stop", "backend": "b"}
    with pytest.raises(ValidationError, match="prompt then its output ids"):
        AuxiliaryCall.model_validate(
            {
                "purpose": "auxiliary",
                "model": "m",
                "turn": turn,
                "tokens": {"input_ids": [1, 3], "loss_mask": [0, 1], "logprobs": [0.0, -0.5]},
            }
        )


def test_a_stored_result_without_auxiliary_still_reads():
    """Results stored before auxiliary existed validate (an empty list)."""
    assert "auxiliary" not in RolloutResult.model_json_schema()["$defs"]["Trajectory"]["required"]


def test_gateway_calls_tell_the_main_loop_from_auxiliary_calls():
    assert GatewayCalls().purpose_of("anything") is None  # no main model: all main
    calls = GatewayCalls(main_model="policy", auxiliary={"small": "small_fast_model"})
    assert calls.purpose_of("policy") is None
    assert calls.purpose_of("small") == "small_fast_model"
    assert calls.purpose_of("other") is None  # a model the table does not name: main

"""``ended_by``: a closed set where the server produces it (``agent.base.EndedBy``), an
open string in the result contract, so a client reading a newer server's results
accepts a reason it does not know."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from rollserve import contract
from rollserve.agent.base import EndedBy
from rollserve.agent.trajectory import Trajectory


def test_the_contract_names_every_reason_the_server_gives():
    description = contract.Trajectory.model_fields["ended_by"].description or ""
    missing = [reason for reason in get_args(EndedBy) if reason not in description]
    assert missing == [], f"the result contract's ended_by does not name {missing}"


@pytest.mark.parametrize("reason", [*get_args(EndedBy), None])
def test_every_reason_the_server_gives_goes_over_the_wire(reason):
    trajectory = Trajectory(messages=[{"role": "user", "content": "2 + 2?"}], ended_by=reason)
    wire = trajectory.to_wire()
    assert contract.Trajectory.model_validate_json(wire.model_dump_json()).ended_by == reason


def test_a_client_reads_a_reason_its_version_does_not_know():
    body = Trajectory().to_wire().model_dump(mode="json")
    body["ended_by"] = "a_reason_a_later_server_added"
    assert contract.Trajectory.model_validate(body).ended_by == "a_reason_a_later_server_added"
    body["ended_by"] = 3  # still a string or null, though
    with pytest.raises(ValidationError):
        contract.Trajectory.model_validate(body)

"""Routing: sticky sessions over the registered backends, health, pause/resume, policy versions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.llm.routing.deadline import call_deadline, current_deadline
    from rollserve.llm.routing.in_force import WeightsInForce
    from rollserve.llm.routing.policies import POLICIES
    from rollserve.llm.routing.router import Router, RouterConfig
    from rollserve.llm.routing.weights import (
        LowerPolicyVersion,
        WeightsRefused,
        WeightUpdate,
        adopter,
    )

_HOMES: dict[str, str] = {
    **dict.fromkeys(("call_deadline", "current_deadline"), "rollserve.llm.routing.deadline"),
    "WeightsInForce": "rollserve.llm.routing.in_force",
    "POLICIES": "rollserve.llm.routing.policies",
    **dict.fromkeys(("Router", "RouterConfig"), "rollserve.llm.routing.router"),
    **dict.fromkeys(
        ("LowerPolicyVersion", "WeightUpdate", "WeightsRefused", "adopter"), "rollserve.llm.routing.weights"
    ),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "LowerPolicyVersion",
    "POLICIES",
    "Router",
    "RouterConfig",
    "WeightUpdate",
    "WeightsInForce",
    "WeightsRefused",
    "adopter",
    "call_deadline",
    "current_deadline",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

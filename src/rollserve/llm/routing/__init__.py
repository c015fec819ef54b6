"""Routing: sticky sessions over the registered backends, health, pause/resume, policy versions."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
    **dict.fromkeys(("LowerPolicyVersion", "WeightUpdate", "WeightsRefused", "adopter"),
                    "rollserve.llm.routing.weights"),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "LowerPolicyVersion", "POLICIES", "Router", "RouterConfig", "WeightUpdate", "WeightsInForce",
    "WeightsRefused", "adopter", "call_deadline", "current_deadline",
]


def __getattr__(name: str) -> object:
    """Import a public name from its home module the first time it is asked for (so
    importing one module of this package does not import the others)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = vars(importlib.import_module(home))[name]
    globals()[name] = value
    return value

"""The weights in force: what the router's policy is (an adapter or the base model), its
policy version, and the last weight load that took; the service keeps them across a
restart (``rollserve.engine.weights_file``), the router reports them in its status.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from rollserve.llm.base import WeightsKind
from rollserve.llm.routing.weights import WeightUpdate


class LastLoad(BaseModel):
    """A weight load that took on at least one backend."""

    model_config = ConfigDict(extra="forbid")

    kind: WeightsKind = Field(description="lora | full")
    name: str | None = Field(None, description="the adapter's name (LoRA only)")
    path: str = Field(description="the folder the servers read it from")
    policy_version: int | None = Field(None, description="the version the load request named")
    failed: list[str] = Field(default_factory=list, description="backends that did not load it")
    loaded_at: float = Field(description="when it ended (Unix time, seconds)")

    @classmethod
    def of(cls, update: WeightUpdate, failed: list[str]) -> LastLoad:
        return cls(
            kind=update.kind,
            name=update.name,
            path=update.path,
            policy_version=update.policy_version,
            failed=failed,
            loaded_at=time.time(),
        )


class WeightsInForce(BaseModel):
    """What a restarted router starts with."""

    model_config = ConfigDict(extra="forbid")

    policy_version: int | None = Field(None, description="stamped on turns sampled now")
    lora: str | None = Field(None, description="the adapter requests name (None: base model)")
    last_load: LastLoad | None = None
    paused: bool = Field(
        False,
        description="written after a load and before its resume: a "
        "restarted router starts paused (the new weights are in the servers, "
        "the version that names them comes with the trainer's resume)",
    )

"""The weights in force: what the router's policy is (an adapter or the base model), its
policy version, and the last weight load that took; the service keeps them across a
restart (``rollserve.engine.weights_file``), the router reports them in its status.

A server added at run time while an adapter is in force is asked whether it serves
the adapter (``verify_adapter``: its ``/v1/models`` lists it) before it is trusted.
That proves the name only: a server started with ``--lora-modules NAME=PATH`` pointing
at an older checkpoint lists the same name, and nothing here can tell.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import LLMError
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import LLMBackend, WeightsKind
from rollserve.llm.routing.weights import WeightsRefused, WeightUpdate


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
        return cls(kind=update.kind, name=update.name, path=update.path,
                   policy_version=update.policy_version, failed=failed, loaded_at=time.time())


class WeightsInForce(BaseModel):
    """What a restarted router starts with."""

    model_config = ConfigDict(extra="forbid")

    policy_version: int | None = Field(None, description="stamped on turns sampled now")
    lora: str | None = Field(None, description="the adapter requests name (None: base model)")
    last_load: LastLoad | None = None


def _model_ids(reply: Any) -> set[str]:
    try:
        cards = reply["data"]
        return {c["id"] for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)}
    except (KeyError, TypeError):
        return set()


async def verify_adapter(backend: LLMBackend, lora: str, timeout: float) -> None:
    """``WeightsRefused`` unless ``backend``'s server lists the adapter ``lora`` in its
    models (``/v1/models``, read within ``timeout`` seconds). A backend that lists no
    models is not asked (``RouterControl.add`` refuses one that cannot serve an adapter)."""
    if not isinstance(backend, ServerBackend) or backend.models_path is None:
        return
    try:
        reply = await backend.http.request_json("GET", backend.models_path, timeout=timeout)
    except (LLMError, TimeoutError) as exc:
        raise WeightsRefused(f"{backend.name}: could not read {backend.models_path} to check "
                             f"that it serves the LoRA adapter {lora!r} the policy is ({exc})"
                             ) from exc
    served = _model_ids(reply)
    if lora not in served:
        listed = ", ".join(sorted(served)) or "nothing"
        raise WeightsRefused(f"{backend.name} does not serve the LoRA adapter {lora!r} the "
                             f"policy is ({backend.models_path} lists {listed}): it would "
                             f"sample another model; serve it there (vLLM: --lora-modules "
                             f"{lora}=PATH) and add it again")

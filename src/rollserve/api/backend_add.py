"""A backend added at run time (``POST /v1/llm/backends``, ProRL's ``/add_llm_server``)
while the policy is a LoRA adapter: its server is asked first whether it serves the
adapter, since every request the router sends it will name the adapter and a server
that does not serve it would answer 404s, or worse, a model of another name.

The check reads the server's model list (vLLM's ``/v1/models``, within the router's
health-probe timeout) and looks for the adapter's name. That proves the name only: a
vLLM started with ``--lora-modules NAME=PATH`` pointing at an older checkpoint lists
the same name, and rollserve cannot tell which version of the adapter it holds.
"""

from __future__ import annotations

from typing import Any

from rollserve.errors import LLMError
from rollserve.llm.backends import ServerBackend
from rollserve.llm.base import LLMBackend
from rollserve.llm.routing import Router, WeightsRefused, adopter


def _model_ids(reply: Any) -> set[str]:
    try:
        cards = reply["data"]
        return {c["id"] for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)}
    except (KeyError, TypeError):
        return set()


async def verify_adapter(backend: LLMBackend, lora: str, timeout: float) -> None:
    """``WeightsRefused`` unless ``backend``'s server lists the adapter ``lora`` among
    its models (read within ``timeout`` seconds), or the list cannot be read. A backend
    without a model list is not asked (``Router.add`` refuses one that cannot serve an
    adapter)."""
    if not isinstance(backend, ServerBackend) or backend.models_path is None:
        return
    try:
        reply = await backend.http.request_json("GET", backend.models_path, timeout=timeout)
    except (LLMError, TimeoutError) as exc:
        raise WeightsRefused(
            f"{backend.name}: could not read {backend.models_path} to check "
            f"that it serves the LoRA adapter {lora!r} the policy is ({exc})"
        ) from exc
    served = _model_ids(reply)
    if lora not in served:
        listed = ", ".join(sorted(served)) or "nothing"
        raise WeightsRefused(
            f"{backend.name} does not serve the LoRA adapter {lora!r} the "
            f"policy is ({backend.models_path} lists {listed}): it would not "
            f"sample the policy; serve it there (vLLM: --lora-modules "
            f"{lora}=PATH) and add it again"
        )


async def add_verified(router: Router, backend: LLMBackend, source: str) -> None:
    """``router.add(backend)``, once a server that is to name the LoRA adapter in force
    has shown it serves it; ``WeightsRefused`` (nothing registered) if not, if it cannot
    serve an adapter, or if the weights changed while it was asked."""
    lora = router.lora
    if lora is not None and adopter(backend, lora) is not None:
        await verify_adapter(backend, lora, router.config.health.timeout)
        if router.lora != lora:
            raise WeightsRefused(f"the policy's weights changed while {backend.name} was checked: add it again")
        if router.is_registered(backend.name):  # two adds of one name, both checked at once
            raise WeightsRefused(
                f"a backend named {backend.name!r} was added while this one was checked; remove it first"
            )
    router.add(backend, source=source)

"""New weights into the inference servers, while generation is paused.

The router loads weights only when it is paused with nothing in flight (so no sample
mixes two policies), and only when every token-level backend it routes to can take
them (so no backend goes on sampling from the old weights under the new policy
version); otherwise nothing is loaded and ``WeightsRefused`` says why. Each load is
bounded, runs on every backend at once, and its outcome is reported by name.

After a load, what later requests name (the adapter after a LoRA, the base model after
full weights) is adopted, without asking the servers again, by backends that did not
load it themselves: one added to the router later, and a cluster node's router replica
(``base.Follower.weights_loaded``), whose backends are other objects on the same servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from rollserve.llm.base import LLMBackend, LoadsWeights, WeightsKind
from rollserve.llm.routing.backend_state import BackendState


class WeightsRefused(Exception):
    """Nothing was loaded: generation is not paused, calls are in flight, or a backend
    cannot take weights of this kind (the message names it)."""


class LowerPolicyVersion(WeightsRefused):
    """A resume named a policy version below the one in force, without saying it means
    to go back (``allow_lower``): turns sampled from the newer weights would be stamped
    older than turns sampled before them. Nothing changed: generation is still paused."""

    def __init__(self, requested: int, in_force: int):
        super().__init__(
            f"policy_version {requested} is below the version in force "
            f"({in_force}): turns sampled from now on would look older than "
            "those before them; resume with a version at least as high, or "
            "say allow_lower_version (e.g. a trainer restarting from an older "
            "checkpoint)"
        )
        self.requested = requested
        self.in_force = in_force


@dataclass(frozen=True)
class WeightUpdate:
    """A LoRA adapter (``name`` and ``path``) or full weights (``path``)."""

    kind: WeightsKind
    path: str
    name: str | None = None  # the adapter's name (LoRA only)
    policy_version: int | None = None  # the version these weights are (SGLang records it)

    def __post_init__(self) -> None:
        if (self.kind == "lora") != (self.name is not None):
            raise ValueError("name: a LoRA adapter has a name, full weights have none")

    @property
    def lora(self) -> str | None:
        """The model name later requests carry: the adapter's; None: the base model's."""
        return self.name if self.kind == "lora" else None


def targets(states: Iterable[BackendState], kind: WeightsKind) -> dict[str, LoadsWeights]:
    """The backends to load ``kind`` weights into: every token-level backend. A
    message-level one (a chat API) serves another model and is left alone;
    ``WeightsRefused`` if a token-level one cannot load them."""
    found: dict[str, LoadsWeights] = {}
    unable: list[str] = []
    for state in states:
        if not state.trainable or state.removed:
            continue
        backend = state.backend
        if isinstance(backend, LoadsWeights) and kind in backend.weight_kinds:
            found[state.name] = backend
        else:
            unable.append(f"{state.name} ({backend.kind})")
    if unable:
        raise WeightsRefused(
            f"backends that cannot load {kind} weights: {', '.join(unable)}; "
            "remove them first (they would go on sampling from the old "
            "weights under the new policy version)"
        )
    if not found:
        raise WeightsRefused("no token-level backend is registered to load weights into")
    return found


async def load(backends: dict[str, LoadsWeights], update: WeightUpdate, timeout: float) -> dict[str, str]:
    """Load ``update`` into every backend at once, each within ``timeout`` seconds:
    "ok" or the error, by name."""

    async def one(backend: LoadsWeights) -> str:
        try:
            async with asyncio.timeout(timeout):
                if update.kind == "lora":
                    assert update.name is not None
                    await backend.load_lora(update.name, update.path)
                else:
                    await backend.load_full(update.path, update.policy_version)
            return "ok"
        except TimeoutError:
            return f"TimeoutError: no answer in {timeout:g} s"
        except Exception as exc:  # reported by name: the caller decides
            return f"{type(exc).__name__}: {exc}"

    results = await asyncio.gather(*(one(b) for b in backends.values()))
    return dict(zip(backends, results, strict=True))


def adopter(backend: LLMBackend, lora: str | None) -> LoadsWeights | None:
    """``backend``, to name ``lora`` (None: the base model) in later requests; None when
    it has nothing to adopt (a message-level backend, or full weights on a backend that
    loads none: its requests name its model as they did). ``WeightsRefused`` when it
    would sample the base model under a policy that is an adapter."""
    if not backend.trainable:
        return None
    if isinstance(backend, LoadsWeights) and (lora is None or "lora" in backend.weight_kinds):
        return backend
    if lora is None:
        return None
    raise WeightsRefused(
        f"{backend.name} ({backend.kind}) cannot serve the LoRA adapter "
        f"{lora!r} the policy is now (it would sample the base model under "
        "the new policy version)"
    )


def adopt(states: Iterable[BackendState], lora: str | None, skip: Collection[str] = ()) -> None:
    """Every token-level backend but those in ``skip`` names ``lora`` (None: the base
    model) in later requests; ``WeightsRefused``, with nothing changed, if one cannot."""
    chosen = [adopter(s.backend, lora) for s in states if not s.removed and s.name not in skip]
    for backend in chosen:
        if backend is not None:
            backend.adopt(lora)

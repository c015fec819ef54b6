"""Weight sync from the trainer's side: pause generation, push new weights into every
inference server, resume under the new policy version.

    from rollserve.client import Client
    from rollserve.client.weights import LoRA, WeightSync

    sync = WeightSync(Client("http://rollserve:8000"))
    model.save_pretrained("/shared/ckpt/policy")            # a PEFT adapter folder
    sync.update(LoRA("policy", "/shared/ckpt/policy"), policy_version=step + 1)

``AsyncWeightSync`` does the same with an ``AsyncClient``. Each update:

1. pauses generation (``POST /v1/llm/pause``, bounded by ``pause_timeout``);
2. loads the weights into every token-level backend (``POST /v1/llm/weights``): a
   LoRA adapter (vLLM, loaded in place; every later request names it) or full
   weights from a folder (vLLM dev mode, SGLang);
3. resumes with ``policy_version`` (``POST /v1/llm/resume``): every turn sampled from
   then on is sampled from, and stamped with, the new policy.

When it fails, the error says what state generation was left in:

- ``PauseTimeout`` (calls still in flight after ``pause_timeout``) and
  ``WeightsRefused`` (the server loaded nothing: a backend cannot take these weights,
  or generation was not paused): nothing was loaded, so generation is resumed at the
  old policy version, and the version is not bumped.
- ``WeightLoadFailed``: a server failed to load (or the server could not be asked):
  some servers may hold the new weights and others not, so generation is left
  **paused**, at the old version. Call ``update`` again (loads are in place), or
  remove the failing backend and ``client.resume(policy_version=k)``.
- ``LowerPolicyVersion``: ``policy_version`` is below the version in force. Checked
  at the pause, before anything is loaded (generation is resumed at the old version);
  if the server refuses the final resume for it (the version in force rose meanwhile),
  the new weights are loaded and generation is left **paused**. A trainer restarting
  from an older checkpoint passes ``allow_lower_version=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from rollserve.client.aio import AsyncClient
from rollserve.client.calls import JSONBody, RollserveError
from rollserve.client.sync import Client
from rollserve.contract import Paused, Resumed, WeightsLoaded, WeightsRequest

__all__ = [
    "AsyncWeightSync",
    "FullWeights",
    "LoRA",
    "LowerPolicyVersion",
    "PauseTimeout",
    "SyncReport",
    "WeightLoadFailed",
    "WeightSync",
    "WeightSyncError",
    "WeightsRefused",
]


@dataclass(frozen=True)
class LoRA:
    """A LoRA adapter folder (PEFT's ``save_pretrained``), loaded under ``name``."""

    name: str
    path: str

    def body(self) -> JSONBody:
        return {"kind": "lora", "name": self.name, "path": str(self.path)}


@dataclass(frozen=True)
class FullWeights:
    """A checkpoint folder (safetensors) with every weight of the served model."""

    path: str

    def body(self) -> JSONBody:
        return {"kind": "full", "path": str(self.path)}


Weights = LoRA | FullWeights


class WeightSyncError(Exception):
    """A weight sync did not complete. ``paused``: generation is still paused;
    ``policy_version``: the version turns are stamped with (the old one)."""

    def __init__(self, message: str, paused: bool, policy_version: int | None):
        super().__init__(message)
        self.paused = paused
        self.policy_version = policy_version


class PauseTimeout(WeightSyncError):
    """Calls were still in flight when the pause timed out: nothing was loaded, and
    generation was resumed at the old version."""


class WeightsRefused(WeightSyncError):
    """The server loaded nothing (HTTP 409: a backend cannot take these weights, or
    generation was not paused); generation was resumed at the old version."""


class WeightLoadFailed(WeightSyncError):
    """A server failed to load the weights (``outcomes``: per backend, "ok" or the
    error; empty when the server could not be asked): generation is left paused."""

    def __init__(self, message: str, policy_version: int | None, outcomes: dict[str, str] | None = None):
        super().__init__(message, paused=True, policy_version=policy_version)
        self.outcomes = outcomes or {}


class LowerPolicyVersion(WeightSyncError):
    """``policy_version`` is below the version in force and ``allow_lower_version`` was
    not given: turns sampled from the new weights would be stamped older than turns
    before them. ``paused`` says whether the weights were loaded (True: generation is
    left paused; resume at a version at least ``policy_version`` or with the override)."""


@dataclass(frozen=True)
class SyncReport:
    """What each step answered."""

    policy_version: int
    paused: Paused
    loaded: WeightsLoaded
    resumed: Resumed


def _pause_timeout(paused: Paused, timeout: float) -> PauseTimeout:
    return PauseTimeout(
        f"{paused.in_flight} LLM calls were still in flight after {timeout:g} s "
        "of pausing: nothing was loaded; generation resumed at policy version "
        f"{paused.policy_version} (use mode='abort' to abort them instead)",
        paused=False,
        policy_version=paused.policy_version,
    )


def _refused(exc: RollserveError, version: int | None) -> WeightsRefused:
    return WeightsRefused(
        f"the server loaded no weights: {exc.detail}; generation resumed at policy version {version}",
        paused=False,
        policy_version=version,
    )


def _unasked(exc: Exception, version: int | None) -> WeightLoadFailed:
    return WeightLoadFailed(
        f"could not load the weights ({type(exc).__name__}: {exc}); "
        f"generation is left paused at policy version {version}",
        version,
    )


def _is_lower(policy_version: int, in_force: int | None, allow_lower_version: bool) -> bool:
    return not allow_lower_version and in_force is not None and policy_version < in_force


def _lower_at_pause(policy_version: int, in_force: int | None) -> LowerPolicyVersion:
    return LowerPolicyVersion(
        f"policy_version {policy_version} is below the version in force "
        f"({in_force}): nothing was loaded; generation resumed at policy "
        f"version {in_force} (pass allow_lower_version=True to go back)",
        paused=False,
        policy_version=in_force,
    )


def _resume_refused(exc: RollserveError, loaded: WeightsLoaded) -> WeightSyncError:
    message = (
        f"the weights were loaded but the resume was refused: {exc.detail}; generation "
        f"is left paused at policy version {loaded.policy_version}"
    )
    lower = "policy_version" in exc.fields
    return (LowerPolicyVersion if lower else WeightSyncError)(
        message, paused=True, policy_version=loaded.policy_version
    )


def _failed(loaded: WeightsLoaded) -> WeightLoadFailed:
    failed = {name: outcome for name, outcome in loaded.outcomes.items() if outcome != "ok"}
    listed = "; ".join(f"{name}: {outcome}" for name, outcome in failed.items())
    return WeightLoadFailed(
        f"weights failed to load on {len(failed)} of {len(loaded.outcomes)} "
        f"backends ({listed}); generation is left paused at policy version "
        f"{loaded.policy_version}",
        loaded.policy_version,
        loaded.outcomes,
    )


class WeightSync:
    """Pause, load, resume with a blocking ``Client`` (see the module docstring)."""

    def __init__(self, client: Client, mode: str = "finish", pause_timeout: float = 600.0, load_timeout: float = 600.0):
        self.client = client
        self.mode = mode
        self.pause_timeout = pause_timeout
        self.load_timeout = load_timeout

    def update(self, weights: Weights, policy_version: int, allow_lower_version: bool = False) -> SyncReport:
        """Load ``weights`` everywhere and resume at ``policy_version``; a
        ``WeightSyncError`` says what state generation was left in. A version below
        the one in force is ``LowerPolicyVersion`` unless ``allow_lower_version``."""
        _checked(weights, policy_version)
        paused = self.client.pause(self.mode, timeout=self.pause_timeout)
        if not paused.drained:
            self.client.resume()
            raise _pause_timeout(paused, self.pause_timeout)
        if _is_lower(policy_version, paused.policy_version, allow_lower_version):
            self.client.resume()
            raise _lower_at_pause(policy_version, paused.policy_version)
        try:
            loaded = self.client.load_weights(weights.body(), policy_version, self.load_timeout)
        except RollserveError as exc:
            if exc.status == 409:
                self.client.resume()
                raise _refused(exc, paused.policy_version) from exc
            raise _unasked(exc, paused.policy_version) from exc
        except httpx.HTTPError as exc:
            raise _unasked(exc, paused.policy_version) from exc
        if not loaded.ok:
            raise _failed(loaded)
        try:
            resumed = self.client.resume(policy_version, allow_lower_version)
        except RollserveError as exc:
            if exc.status == 409:
                raise _resume_refused(exc, loaded) from exc
            raise
        return SyncReport(policy_version, paused, loaded, resumed)


class AsyncWeightSync:
    """Pause, load, resume with an ``AsyncClient`` (see the module docstring)."""

    def __init__(
        self, client: AsyncClient, mode: str = "finish", pause_timeout: float = 600.0, load_timeout: float = 600.0
    ):
        self.client = client
        self.mode = mode
        self.pause_timeout = pause_timeout
        self.load_timeout = load_timeout

    async def update(self, weights: Weights, policy_version: int, allow_lower_version: bool = False) -> SyncReport:
        """Load ``weights`` everywhere and resume at ``policy_version``; a
        ``WeightSyncError`` says what state generation was left in. A version below
        the one in force is ``LowerPolicyVersion`` unless ``allow_lower_version``."""
        _checked(weights, policy_version)
        paused = await self.client.pause(self.mode, timeout=self.pause_timeout)
        if not paused.drained:
            await self.client.resume()
            raise _pause_timeout(paused, self.pause_timeout)
        if _is_lower(policy_version, paused.policy_version, allow_lower_version):
            await self.client.resume()
            raise _lower_at_pause(policy_version, paused.policy_version)
        try:
            loaded = await self.client.load_weights(weights.body(), policy_version, self.load_timeout)
        except RollserveError as exc:
            if exc.status == 409:
                await self.client.resume()
                raise _refused(exc, paused.policy_version) from exc
            raise _unasked(exc, paused.policy_version) from exc
        except httpx.HTTPError as exc:
            raise _unasked(exc, paused.policy_version) from exc
        if not loaded.ok:
            raise _failed(loaded)
        try:
            resumed = await self.client.resume(policy_version, allow_lower_version)
        except RollserveError as exc:
            if exc.status == 409:
                raise _resume_refused(exc, loaded) from exc
            raise
        return SyncReport(policy_version, paused, loaded, resumed)


def _checked(weights: Weights, policy_version: int) -> None:
    """Check the request here, before anything is paused: a name or path the server
    would refuse (a 422) must not leave generation paused. ``pydantic.ValidationError``
    names the field."""
    WeightsRequest.model_validate({"weights": weights.body(), "policy_version": policy_version})

"""The router's control plane: which backends it routes to, and control over them.

The call path (choose a backend, pin a trajectory to it, send, retry) is
``router.Router``, which extends ``RouterControl``; this module is what a trainer or
an operator drives between calls.

Registry. ``add``, ``drain`` (finish in flight, take nothing new), ``undrain``,
``remove``; health (``health.HealthMonitor``, started and stopped with the service).

Pause. ``pause(mode)`` around a weight update — new calls wait, and calls in flight
either finish (``finish``, and ``pause`` returns once they have) or are aborted and
sent again after ``resume`` (``abort``) — and ``resume(policy_version)``.
Optionally the pause is forwarded to backends that support it (vLLM dev mode,
SGLang). While paused with nothing in flight, ``load_weights`` pushes a LoRA adapter
or full weights into every token-level backend (``routing.weights``).

Followers (``base.Follower``: a cluster node's router replica) are paused, resumed,
given backends and told of every weight load with this router.

After a LoRA load, ``lora`` names the adapter the policy is: a backend added later
names it in its requests too (or is refused, if it cannot serve an adapter), and so
does every follower's backend (``weights.adopt``), so that nothing samples the base
model under the new policy version. ``in_force()`` is what the service
keeps across a restart (the adapter, the policy version, ``last_load``); a router built
from it names the adapter from its first call.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Collection

from pydantic import BaseModel, Field

from rollserve.llm.base import LLMBackend, PauseMode
from rollserve.llm.routing.backend_state import BackendState
from rollserve.llm.routing.base import Follower
from rollserve.llm.routing.call_metrics import CallMetrics
from rollserve.llm.routing.forward import forward, pausable
from rollserve.llm.routing.health import HealthConfig, HealthMonitor
from rollserve.llm.routing.in_force import LastLoad, WeightsInForce
from rollserve.llm.routing.inflight import InFlightCalls
from rollserve.llm.routing.policies import Policy, make_policy
from rollserve.llm.routing.weights import (
    LowerPolicyVersion,
    WeightsRefused,
    WeightUpdate,
    adopt,
    adopter,
    load,
    targets,
)

log = logging.getLogger(__name__)


class RouterConfig(BaseModel):
    policy: str = Field("least_load", description="routing policy (llm.policies)")
    max_attempts: int = Field(4, ge=1, le=100, description="tries per call, all backends")
    retry_backoff: float = Field(0.05, ge=0, description="seconds before the 2nd try; doubles")
    retry_backoff_max: float = Field(2.0, ge=0)
    attempt_timeout: float | None = Field(
        None,
        gt=0,
        description=(
            "seconds one try may take at its backend before it is abandoned and retried (its wait for a "
            "connection slot not counted; None: the backend's own timeout)"
        ),
    )
    forward_pause: bool = Field(
        False, description="forward pause/resume to backends that support it (vLLM dev mode, SGLang)"
    )
    health: HealthConfig = Field(default_factory=HealthConfig)


class RouterControl:
    """Backends by name and their state; pause, resume and weight loads; followers."""

    def __init__(
        self,
        policy_version: int | None = None,
        config: RouterConfig | None = None,
        policy: Policy | None = None,
        lora: str | None = None,
        last_load: LastLoad | None = None,
        paused: bool = False,
    ):
        """``lora``: the LoRA adapter the policy is (loaded by another router: a node
        replica's head; or by this server before a restart), which every token-level
        backend added here names; ``last_load``: the last load that took (reported);
        ``paused``: start paused (a restart between a load and its resume: nothing samples
        the new weights under the old version until the trainer resumes)."""
        self.config = config or RouterConfig()
        self.policy = policy or make_policy(self.config.policy)
        self.policy_version: int | None = policy_version
        self.paused = paused
        self.pause_mode: PauseMode | None = "finish" if paused else None
        self.counters = {"calls": 0, "retries": 0, "aborted_by_pause": 0, "failed": 0, "moves": 0}
        self.health = HealthMonitor(self, self.config.health)
        self.metrics = CallMetrics()  # per-backend request latency and tokens (``/metrics``)
        self._states: dict[str, BackendState] = {}
        self._inflight = InFlightCalls()
        self._paused_backends: list[str] = []
        self._changed = asyncio.Event()  # a backend became usable
        self._resumed = asyncio.Event()
        if not paused:
            self._resumed.set()
        self._loading = False  # a weight load is under way
        self.followers: list[Follower] = []  # routers elsewhere, paused and resumed with this
        self._followers_drained = False  # the last pause drained every follower
        self.lora: str | None = lora  # the adapter the policy is; None: the base model
        self.last_load: LastLoad | None = last_load  # the last weight load that took

    # --- life cycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Start health checking (the service calls this; tests may skip it)."""
        self.health.start()

    async def stop(self) -> None:
        """Stop health checking and remove (and close) every backend."""
        await self.health.stop()
        for name in list(self._states):
            await self.remove(name)

    # --- registry ----------------------------------------------------------------------
    def add(self, backend: LLMBackend, weight: float | None = None, source: str | None = None) -> None:
        """Register ``backend``; ``source``: its spec as JSON, which followers build their
        own from (a backend added without one stays this router's). While the policy is
        a LoRA adapter, the backend names it in its requests (its server must serve it:
        vLLM's ``--lora-modules``); ``WeightsRefused`` (nothing registered) if it cannot,
        or while a weight load is under way."""
        if backend.name in self._states:
            raise ValueError(f"name: a backend named {backend.name!r} is already registered")
        if self._loading:
            raise WeightsRefused("a weight load is under way: add the backend once it has ended")
        if self.lora is not None:
            adopting = adopter(backend, self.lora)  # before it can take a call
            if adopting is not None:
                adopting.adopt(self.lora)
        state = BackendState(backend, weight=float(backend.weight if weight is None else weight))
        self._states[backend.name] = state
        self.metrics.track(backend.name)
        self.health.poke(state)  # probed at once when the monitor runs
        self._notify()
        if source is not None:
            for follower in self.followers:
                follower.backend_added(backend.name, source, state.weight)

    async def remove(self, name: str, close: bool = True, grace: float = 0.0) -> LLMBackend:
        """Unregister ``name`` now; sessions pinned to it pick again at their next call.

        Requests in flight get up to ``grace`` seconds to finish before the backend is
        closed; any still running then fail and are retried elsewhere.
        """
        state = self._states.pop(name, None)
        if state is None:
            raise KeyError(name)
        state.removed = True
        self.metrics.forget(name)
        await asyncio.gather(*(f.backend_removed(name, grace) for f in self.followers))
        if grace > 0:
            await self._inflight.wait_until(lambda: state.outstanding == 0, grace)
        if close:
            await state.backend.close()
        return state.backend

    def drain(self, name: str) -> dict:
        """Take no new requests on ``name`` (its trajectories move); in flight finish."""
        state = self._state(name)
        state.draining = True
        return state.snapshot()

    def undrain(self, name: str) -> dict:
        state = self._state(name)
        state.draining = False
        self._notify()
        return state.snapshot()

    async def wait_drained(self, name: str, timeout: float | None = None) -> bool:
        """True once ``name`` has nothing in flight (False if ``timeout`` passes first)."""
        state = self._state(name)
        return await self._inflight.wait_until(lambda: state.outstanding == 0, timeout)

    def set_healthy(self, name: str, healthy: bool) -> None:
        """Mark a backend (un)healthy; unhealthy ones get no new requests."""
        state = self._state(name)
        state.healthy = healthy
        if healthy:
            self._notify()

    def get(self, name: str) -> LLMBackend:
        return self._states[name].backend

    def is_registered(self, name: str) -> bool:
        return name in self._states

    def states(self) -> list[BackendState]:
        return list(self._states.values())

    def list(self) -> list[dict]:
        return [state.snapshot() for state in self._states.values()]

    def is_healthy(self, name: str) -> bool:
        """Registered and not marked unhealthy."""
        state = self._states.get(name)
        return state is not None and state.healthy

    def outstanding(self, name: str) -> int:
        state = self._states.get(name)
        return state.outstanding if state else 0

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def status(self) -> dict:
        return {
            "paused": self.paused,
            "pause_mode": self.pause_mode,
            "policy_version": self.policy_version,
            "policy": self.policy.name,
            "in_flight": self.in_flight,
            "health_checks": self.health.running,
            "lora": self.lora,
            "last_load": None if self.last_load is None else self.last_load.model_dump(),
            **self.counters,
        }

    def in_force(self) -> WeightsInForce:
        """The weights in force, as a restarted router is to start with them."""
        return WeightsInForce(
            policy_version=self.policy_version, lora=self.lora, last_load=self.last_load, paused=self.paused
        )

    # --- pause / resume ------------------------------------------------------------------
    async def pause(
        self, mode: PauseMode = "finish", timeout: float | None = None, forward: bool | None = None
    ) -> dict:
        """Hold new calls; ``finish``: wait (up to ``timeout``) for those in flight;
        ``abort``: abort them now (they are sent again after ``resume``)."""
        if mode not in ("finish", "abort"):
            raise ValueError(f"mode: expected 'finish' or 'abort', got {mode!r}")
        forward = self.config.forward_pause if forward is None else forward
        self.paused, self.pause_mode = True, mode
        self._resumed.clear()
        forwarded: dict[str, str] = {}
        aborted = 0
        if mode == "abort":
            if forward:
                forwarded = await self._forward_pause(mode)
            aborted = self._inflight.abort_all()
        followed = asyncio.gather(*(f.pause(mode, timeout) for f in self.followers))
        drained = await self._inflight.wait_until(lambda: not self._inflight, timeout)
        self._followers_drained = all(await followed)
        drained = self._followers_drained and drained
        if mode == "finish" and forward:
            forwarded = await self._forward_pause(mode)
        log.info("paused (%s): %d aborted, %d still in flight", mode, aborted, self.in_flight)
        return {
            "paused": True,
            "mode": mode,
            "aborted": aborted,
            "drained": drained,
            "in_flight": self.in_flight,
            "policy_version": self.policy_version,
            "forwarded": forwarded,
        }

    async def resume(self, policy_version: int | None = None, allow_lower: bool = False) -> dict:
        """Let calls go again, stamped with ``policy_version`` from now on.

        ``LowerPolicyVersion`` (nothing changes) for a version below the one in force,
        unless ``allow_lower``."""
        if self._loading:
            raise WeightsRefused("a weight load is under way: resume once it has ended")
        current = self.policy_version
        if policy_version is not None and current is not None and policy_version < current and not allow_lower:
            raise LowerPolicyVersion(policy_version, current)
        if policy_version is not None:
            self.policy_version = policy_version
        forwarded = await self._forward_resume() if self._paused_backends else {}
        await asyncio.gather(*(f.resume(self.policy_version) for f in self.followers))
        self._paused_backends = []
        self.paused, self.pause_mode = False, None
        self._resumed.set()
        self._notify()
        log.info("resumed at policy version %s", self.policy_version)
        return {"paused": False, "policy_version": self.policy_version, "forwarded": forwarded}

    async def load_weights(self, update: WeightUpdate, timeout: float) -> dict[str, str]:
        """Load ``update`` into every token-level backend (each within ``timeout``
        seconds): the outcome by backend name. ``WeightsRefused`` (nothing loaded) unless
        paused with nothing in flight (followers drained) and every such backend can take
        it. Once loaded somewhere, followers adopt it before this returns (a resume waits)."""
        if not self.paused:
            raise WeightsRefused("generation is not paused: POST /v1/llm/pause first")
        if self.in_flight:
            raise WeightsRefused(
                f"{self.in_flight} calls are still in flight: pause again "
                "(mode abort, or a longer timeout) before loading weights"
            )
        if self._loading:
            raise WeightsRefused("another weight load is under way")
        if self.followers and not self._followers_drained:
            raise WeightsRefused(
                "a cluster node's router replica did not drain at the last "
                "pause (its calls may still be sampling): pause again (mode "
                "abort, or a longer timeout) before loading weights"
            )
        backends = targets(self._states.values(), update.kind)
        self._loading = True
        telling: asyncio.Future[list[None]] | None = None
        try:
            outcomes = await load(backends, update, timeout)
            failed = [name for name, outcome in outcomes.items() if outcome != "ok"]
            if len(failed) < len(outcomes):  # loaded somewhere: the policy is these weights
                self.lora = update.lora
                self.last_load = LastLoad.of(update, failed)
                # Followers' backends are other objects on the same servers: each names
                # what its twin here names now (a failed one's twin keeps its name). Full
                # weights keep the served model's name, so they need this only when an
                # adapter was in force: its name gives way to the base model's again.
                # Shielded: a cancel here leaves no follower untold (each is bounded).
                telling = asyncio.gather(*(f.weights_loaded(update, failed) for f in self.followers))
                await asyncio.shield(telling)
        finally:
            if telling is not None and not telling.done():  # cancelled while they are told:
                telling.add_done_callback(self._followers_told)  # still under way till then
            else:
                self._loading = False
        for name, outcome in outcomes.items():
            if outcome != "ok" and name in self._states:
                self._states[name].last_error = f"weights: {outcome}"
        log.info("weights (%s) loaded: %s", update.kind, outcomes)
        return outcomes

    def _followers_told(self, telling: asyncio.Future[builtins.list[None]]) -> None:
        """The followers' step of a load whose caller was cancelled has ended."""
        self._loading = False
        if not telling.cancelled() and telling.exception() is not None:
            log.error("telling the followers of a weight load failed: %r", telling.exception())

    def adopt_weights(self, lora: str | None, skip: Collection[str] = ()) -> None:
        """Weights were loaded into this router's servers by another router (a node
        replica's head): every token-level backend but those in ``skip`` names ``lora``
        (None: the base model) in later requests, as do backends added later; nothing is
        sent to a server. ``WeightsRefused`` (nothing changed) if one cannot serve it."""
        adopt(self._states.values(), lora, skip)
        self.lora = lora

    async def _forward_pause(self, mode: PauseMode) -> dict[str, str]:
        """``pause(mode)`` on every ``Pausable`` backend (remembered for resume)."""
        targets = pausable(self._states.values())
        self._paused_backends = list(targets)
        return await forward({name: b.pause(mode) for name, b in targets.items()}, self.config.health.timeout)

    async def _forward_resume(self) -> dict[str, str]:
        """``resume()`` on the backends the pause was forwarded to."""
        targets = pausable(self._states[n] for n in self._paused_backends if n in self._states)
        return await forward({name: b.resume() for name, b in targets.items()}, self.config.health.timeout)

    # --- helpers ----------------------------------------------------------------------------
    def _state(self, name: str) -> BackendState:
        try:
            return self._states[name]
        except KeyError:
            raise KeyError(name) from None

    def _notify(self) -> None:
        # Wake every waiter, then arm a fresh event for the next wait.
        self._changed.set()
        self._changed = asyncio.Event()

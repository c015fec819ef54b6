"""The router: which inference backend serves each trajectory, and control over them.

Routing. A trajectory's session picks a backend at its first call and keeps it
(prefix-cache affinity); the policy (``policies.LeastLoad`` by default) picks the
healthy backend with the least expected wait and moves a trajectory only when its
backend is clearly the worse place to be. With no usable backend, a call waits
until one is added or recovers: the caller's deadline bounds that wait, like every
other wait in a rollout.

Failures. Connection errors, 5xx, 429 and timeouts (the backend's own, or
``attempt_timeout`` for one try) are retried with exponential backoff, on another
backend when there is one, up to ``max_attempts`` and within the call's deadline
(``llm.deadline``); what finally fails is an ``LLMError``
carrying the status, the backend and the attempt count. A failing backend gets an
immediate health probe; an unhealthy one takes no new requests until a probe
succeeds (``health.HealthMonitor``, started and stopped with the service).

Control. ``add``, ``drain`` (finish in flight, take nothing new), ``undrain``,
``remove``; ``pause(mode)`` around a weight update — new calls wait, and calls in
flight either finish (``finish``, and ``pause`` returns once they have) or are
aborted and sent again after ``resume`` (``abort``) — and ``resume(policy_version)``.
Optionally the pause is forwarded to backends that support it (vLLM dev mode,
SGLang). While paused with nothing in flight, ``load_weights`` pushes a LoRA adapter
or full weights into every token-level backend (``routing.weights``). Every
generation is stamped with the policy version in force when its request was sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel, Field

from rollserve.errors import LLMError
from rollserve.llm.base import (
    BackendKind,
    ChatReply,
    Generation,
    LLMBackend,
    Message,
    PauseMode,
    SamplingParams,
    ToolSchema,
)
from rollserve.llm.routing.backend_state import BackendState
from rollserve.llm.routing.base import Follower, Pinned
from rollserve.llm.routing.call_metrics import CallMetrics
from rollserve.llm.routing.deadline import current_deadline, remaining
from rollserve.llm.routing.forward import forward, pausable
from rollserve.llm.routing.health import HealthConfig, HealthMonitor
from rollserve.llm.routing.inflight import InFlightCalls, retrieve
from rollserve.llm.routing.policies import Policy, make_policy
from rollserve.llm.routing.session import RouterSession
from rollserve.llm.routing.weights import WeightsRefused, WeightUpdate, load, targets

log = logging.getLogger(__name__)



# Node replicas (``--ray``) do not follow a LoRA load: they would go on naming the base
# model while their turns are stamped with the new policy version.
LORA_WITH_FOLLOWERS = ("kind: LoRA adapters are not supported with --ray yet (the nodes' "
                       "router replicas would keep sampling the base model under the new "
                       "policy version); load full weights")


class _Aborted:
    """An attempt aborted by a pause: sent again after resume."""


_ABORTED = _Aborted()
# (Module-level names: inside Router, ``list`` is its method.)
TokenIds = list[int]
Messages = list[Message]
Tools = list[ToolSchema]
Reply = TypeVar("Reply", Generation, ChatReply)


class RouterConfig(BaseModel):
    policy: str = Field("least_load", description="routing policy (llm.policies)")
    max_attempts: int = Field(4, ge=1, le=100, description="tries per call, all backends")
    retry_backoff: float = Field(0.05, ge=0, description="seconds before the 2nd try; doubles")
    retry_backoff_max: float = Field(2.0, ge=0)
    attempt_timeout: float | None = Field(
        None, gt=0, description="seconds one try may take before it is abandoned and retried "
                                "(None: the backend's own timeout)")
    forward_pause: bool = Field(False, description="forward pause/resume to backends that "
                                                   "support it (vLLM dev mode, SGLang)")
    health: HealthConfig = Field(default_factory=HealthConfig)


class Router:
    """Backends by name, their state, and the calls made through them."""

    def __init__(self, policy_version: int | None = None, config: RouterConfig | None = None,
                 policy: Policy | None = None):
        self.config = config or RouterConfig()
        self.policy = policy or make_policy(self.config.policy)
        self.policy_version: int | None = policy_version
        self.paused = False
        self.pause_mode: PauseMode | None = None
        self.counters = {"calls": 0, "retries": 0, "aborted_by_pause": 0, "failed": 0, "moves": 0}
        self.health = HealthMonitor(self, self.config.health)
        self.metrics = CallMetrics()  # per-backend request latency and tokens (``/metrics``)
        self._states: dict[str, BackendState] = {}
        self._inflight = InFlightCalls()
        self._paused_backends: list[str] = []
        self._changed = asyncio.Event()  # a backend became usable
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._loading = False  # a weight load is under way
        self.followers: list[Follower] = []  # routers elsewhere, paused and resumed with this
        self._followers_drained = False  # the last pause drained every follower

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
    def add(self, backend: LLMBackend, weight: float | None = None,
            source: str | None = None) -> None:
        """Register ``backend``; ``source``: its spec as JSON, which followers build their
        own from (a backend added without one stays this router's)."""
        if backend.name in self._states:
            raise ValueError(f"name: a backend named {backend.name!r} is already registered")
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
        return {"paused": self.paused, "pause_mode": self.pause_mode,
                "policy_version": self.policy_version, "policy": self.policy.name,
                "in_flight": self.in_flight, "health_checks": self.health.running,
                **self.counters}

    def session(self, key: str = "") -> RouterSession:
        return RouterSession(self, key)

    # --- pause / resume ------------------------------------------------------------------
    async def pause(self, mode: PauseMode = "finish", timeout: float | None = None,
                    forward: bool | None = None) -> dict:
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
        return {"paused": True, "mode": mode, "aborted": aborted, "drained": drained,
                "in_flight": self.in_flight, "policy_version": self.policy_version,
                "forwarded": forwarded}

    async def resume(self, policy_version: int | None = None) -> dict:
        """Let calls go again, stamped with ``policy_version`` from now on."""
        if self._loading:
            raise WeightsRefused("a weight load is under way: resume once it has ended")
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
        paused with nothing in flight and every such backend can take it."""
        if not self.paused:
            raise WeightsRefused("generation is not paused: POST /v1/llm/pause first")
        if self.in_flight:
            raise WeightsRefused(f"{self.in_flight} calls are still in flight: pause again "
                                 "(mode abort, or a longer timeout) before loading weights")
        if self._loading:
            raise WeightsRefused("another weight load is under way")
        if self.followers and update.kind == "lora":
            raise WeightsRefused(LORA_WITH_FOLLOWERS)
        if self.followers and not self._followers_drained:
            raise WeightsRefused("a cluster node's router replica did not drain at the last "
                                 "pause (its calls may still be sampling): pause again (mode "
                                 "abort, or a longer timeout) before loading weights")
        backends = targets(self._states.values(), update.kind)
        self._loading = True
        try:
            outcomes = await load(backends, update, timeout)
        finally:
            self._loading = False
        for name, outcome in outcomes.items():
            if outcome != "ok" and name in self._states:
                self._states[name].last_error = f"weights: {outcome}"
        log.info("weights (%s) loaded: %s", update.kind, outcomes)
        return outcomes

    async def _forward_pause(self, mode: PauseMode) -> dict[str, str]:
        """``pause(mode)`` on every ``Pausable`` backend (remembered for resume)."""
        targets = pausable(self._states.values())
        self._paused_backends = list(targets)
        return await forward({name: b.pause(mode) for name, b in targets.items()},
                             self.config.health.timeout)

    async def _forward_resume(self) -> dict[str, str]:
        """``resume()`` on the backends the pause was forwarded to."""
        targets = pausable(self._states[n] for n in self._paused_backends if n in self._states)
        return await forward({name: b.resume() for name, b in targets.items()},
                             self.config.health.timeout)

    # --- calls -----------------------------------------------------------------------------
    async def generate(self, session: Pinned, prompt_ids: TokenIds,
                       sampling: SamplingParams) -> Generation:
        return await self._call(session, "tokens", lambda b: b.generate(prompt_ids, sampling))

    async def chat(self, session: Pinned, messages: Messages, sampling: SamplingParams,
                   tools: Tools | None = None) -> ChatReply:
        return await self._call(session, "messages",
                                lambda b: b.chat(messages, sampling, tools=tools))

    async def choose_kind(self, session: Pinned) -> BackendKind:
        """``tokens`` or ``messages``: what the session's backend takes (pins one if needed)."""
        if session.backend in self._states:
            return "tokens" if self._states[session.backend].trainable else "messages"
        while True:
            usable = [s for s in self._states.values() if s.usable]
            if any(s.serves("tokens") for s in usable):
                return "tokens"
            if any(s.serves("messages") for s in usable):
                return "messages"
            await self._changed.wait()

    async def _call(self, session: Pinned, kind: BackendKind,
                    send: Callable[[LLMBackend], Awaitable[Reply]]) -> Reply:
        attempts = 0
        last: LLMError | None = None
        avoid: set[str] = set()
        self.counters["calls"] += 1
        while True:
            await self._resumed.wait()  # the pause gate: at once when not paused
            state = await self._choose(session, kind, avoid, waiting_deadline=last is not None)
            if state is None:  # the deadline came while no backend was usable
                raise self._final(last, attempts)
            if self.paused:
                continue  # paused while we waited for a backend
            version = self.policy_version
            attempts += 1
            outcome = await self._attempt(state, send)
            if isinstance(outcome, _Aborted):
                attempts -= 1  # a pause is not a failure
                continue
            if isinstance(outcome, LLMError):
                last = outcome
                delay = min(self.config.retry_backoff_max,
                            self.config.retry_backoff * 2 ** (attempts - 1))
                left = remaining()
                if (not outcome.retryable or attempts >= self.config.max_attempts
                        or (left is not None and left <= delay)):
                    self.counters["failed"] += 1
                    raise self._final(outcome, attempts)
                avoid.add(state.name)
                self.counters["retries"] += 1
                log.warning("session %s: %s (try %d); retrying in %.2fs",
                            session.key, outcome.message, attempts, delay)
                await asyncio.sleep(delay)
                continue
            outcome.policy_version = version
            if not outcome.backend:
                outcome.backend = state.name
            return outcome

    @staticmethod
    def _final(error: LLMError | None, attempts: int) -> LLMError:
        if error is None:
            return LLMError("no usable inference backend before the deadline", attempts=attempts)
        if attempts <= 1:
            return error
        final = LLMError(f"{error.message} (gave up after {attempts} tries)", status=error.status,
                         backend=error.backend, attempts=attempts, retryable=error.retryable)
        final.__cause__ = error
        return final

    async def _choose(self, session: Pinned, kind: BackendKind, avoid: set[str],
                      waiting_deadline: bool) -> BackendState | None:
        """The backend for the session's next request (pinning it); waits while none is
        usable. None if the call's deadline passes first (only when retrying)."""
        loop = asyncio.get_running_loop()
        while True:
            candidates = [s for s in self._states.values() if s.usable and s.serves(kind)]
            pinned = self._states.get(session.backend) if session.backend else None
            if (pinned is not None and pinned in candidates and pinned.name not in avoid
                    and self.policy.keep(pinned, candidates)):
                return pinned
            pool = [s for s in candidates if s.name not in avoid] or candidates
            if pool:
                chosen = self.policy.pick(pool, session.key)
                self._pin(session, chosen)
                return chosen
            changed = self._changed
            deadline = current_deadline() if waiting_deadline else None
            if deadline is None:
                await changed.wait()
                continue
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
                # that arrives as the event is set (a rollout's cancel must never be lost).
                async with asyncio.timeout(left):
                    await changed.wait()
            except TimeoutError:
                return None

    def _pin(self, session: Pinned, state: BackendState) -> None:
        if session.backend == state.name:
            return
        old = self._states.get(session.backend) if session.backend else None
        if old is not None:
            old.sessions -= 1
            self.counters["moves"] += 1
        state.sessions += 1
        state.assigned += 1
        session.backend = state.name

    def unpin(self, session: Pinned) -> None:
        state = self._states.get(session.backend) if session.backend else None
        if state is not None:
            state.sessions -= 1
        session.backend = None

    async def _attempt(self, state: BackendState,
                       send: Callable[[LLMBackend], Awaitable[Reply]]) -> Reply | LLMError | _Aborted:
        """One request: its result, an ``LLMError`` to retry or raise, or ``_ABORTED``."""
        loop = asyncio.get_running_loop()
        state.outstanding += 1
        concurrency = state.outstanding
        started = loop.time()
        entry = self._inflight.start(asyncio.ensure_future(send(state.backend)))
        try:
            try:
                await asyncio.wait([entry.task], timeout=self.config.attempt_timeout)
            except asyncio.CancelledError:  # the caller gave up: so does the request
                entry.task.cancel()
                entry.task.add_done_callback(retrieve)
                raise
            if not entry.task.done():  # a hung server: give up on this try
                entry.task.cancel()
                entry.task.add_done_callback(retrieve)
                error = LLMError(f"{state.name}: no answer in {self.config.attempt_timeout:g} s",
                                 backend=state.name)
                state.record_failure(error.message)
                self.metrics.failed(state.name, loop.time() - started)
                self.health.poke(state)
                return error
        finally:
            state.outstanding -= 1
            self._inflight.end(entry)
        task = entry.task
        if task.cancelled():
            if entry.aborted:
                self.counters["aborted_by_pause"] += 1
                return _ABORTED
            raise asyncio.CancelledError()
        exc = task.exception()
        if isinstance(exc, LLMError):
            exc.backend = exc.backend or state.name
            state.record_failure(exc.message)
            self.metrics.failed(state.name, loop.time() - started)
            if exc.retryable:
                self.health.poke(state)
            return exc
        if exc is not None:
            raise exc
        result = task.result()
        if result.finish_reason == "abort":
            if entry.aborted or self.paused:
                self.counters["aborted_by_pause"] += 1
                return _ABORTED
            error = LLMError(f"{state.name}: the server aborted the request", backend=state.name)
            state.record_failure(error.message)
            self.metrics.failed(state.name, loop.time() - started)
            return error
        seconds = loop.time() - started
        state.record_success(seconds, concurrency)
        self.metrics.answered(state.name, seconds, result)
        return result

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

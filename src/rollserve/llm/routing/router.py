"""The router: which inference backend serves each trajectory (``RouterControl``,
``control.py``, holds the backends and the control over them: registry, health,
pause, resume, weight loads, followers).

Routing. A trajectory's session picks a backend at its first call and keeps it
(prefix-cache affinity); the policy (``policies.LeastLoad`` by default) picks the
healthy backend with the least expected wait and moves a trajectory only when its
backend is clearly the worse place to be. With no usable backend, a call waits
until one is added or recovers: the caller's deadline bounds that wait, like every
other wait in a rollout.

Failures. Connection errors, 5xx, 429 and timeouts (the backend's own, or
``attempt_timeout`` for one try, its wait for a connection slot in the backend's
bounded pool not counted) are retried with exponential backoff, on another
backend when there is one, up to ``max_attempts`` and within the call's deadline
(``llm.deadline``); what finally fails is an ``LLMError``
carrying the status, the backend and the attempt count. A failing backend gets an
immediate health probe; an unhealthy one takes no new requests until a probe
succeeds.

Pauses. A call waits while the router is paused; an attempt a pause aborted is sent
again after ``resume``. Every generation is stamped with the policy version in force
when its request was sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rollserve.errors import LLMError
from rollserve.llm.base import (
    SLOT_WAIT,
    BackendKind,
    ChatReply,
    Generation,
    LLMBackend,
    Message,
    SamplingParams,
    SlotWait,
    ToolSchema,
)
from rollserve.llm.routing.backend_state import BackendState
from rollserve.llm.routing.base import Pinned
from rollserve.llm.routing.control import RouterConfig, RouterControl
from rollserve.llm.routing.deadline import current_deadline, remaining
from rollserve.llm.routing.inflight import retrieve
from rollserve.llm.routing.session import RouterSession

__all__ = ["Router", "RouterConfig"]

log = logging.getLogger(__name__)


class _Aborted:
    """An attempt aborted by a pause: sent again after resume."""


_ABORTED = _Aborted()
# (Module-level aliases: ``list`` is a method of the router.)
TokenIds = list[int]
Messages = list[Message]
Tools = list[ToolSchema]
Reply = TypeVar("Reply", Generation, ChatReply)


class Router(RouterControl):
    """Backends by name, their state, and the calls made through them."""

    def session(self, key: str = "") -> RouterSession:
        return RouterSession(self, key)

    # --- calls -----------------------------------------------------------------------------
    async def generate(self, session: Pinned, prompt_ids: TokenIds, sampling: SamplingParams) -> Generation:
        return await self._call(session, "tokens", lambda b: b.generate(prompt_ids, sampling))

    async def chat(
        self, session: Pinned, messages: Messages, sampling: SamplingParams, tools: Tools | None = None
    ) -> ChatReply:
        return await self._call(session, "messages", lambda b: b.chat(messages, sampling, tools=tools))

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

    async def _call(self, session: Pinned, kind: BackendKind, send: Callable[[LLMBackend], Awaitable[Reply]]) -> Reply:
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
                delay = min(self.config.retry_backoff_max, self.config.retry_backoff * 2 ** (attempts - 1))
                left = remaining()
                if (
                    not outcome.retryable
                    or attempts >= self.config.max_attempts
                    or (left is not None and left <= delay)
                ):
                    self.counters["failed"] += 1
                    raise self._final(outcome, attempts)
                avoid.add(state.name)
                self.counters["retries"] += 1
                log.warning("session %s: %s (try %d); retrying in %.2fs", session.key, outcome.message, attempts, delay)
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
        final = LLMError(
            f"{error.message} (gave up after {attempts} tries)",
            status=error.status,
            backend=error.backend,
            attempts=attempts,
            retryable=error.retryable,
        )
        final.__cause__ = error
        return final

    async def _choose(
        self, session: Pinned, kind: BackendKind, avoid: set[str], waiting_deadline: bool
    ) -> BackendState | None:
        """The backend for the session's next request (pinning it); waits while none is
        usable. None if the call's deadline passes first (only when retrying)."""
        loop = asyncio.get_running_loop()
        while True:
            candidates = [s for s in self._states.values() if s.usable and s.serves(kind)]
            pinned = self._states.get(session.backend) if session.backend else None
            if (
                pinned is not None
                and pinned in candidates
                and pinned.name not in avoid
                and self.policy.keep(pinned, candidates)
            ):
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

    async def _attempt(
        self, state: BackendState, send: Callable[[LLMBackend], Awaitable[Reply]]
    ) -> Reply | LLMError | _Aborted:
        """One request: its result, an ``LLMError`` to retry or raise, or ``_ABORTED``."""
        loop = asyncio.get_running_loop()
        state.outstanding += 1
        concurrency = state.outstanding
        started = loop.time()
        slot_wait = SlotWait()
        token = SLOT_WAIT.set(slot_wait)  # the task copies the context: the backend sees it
        try:
            entry = self._inflight.start(asyncio.ensure_future(send(state.backend)))
        finally:
            SLOT_WAIT.reset(token)
        try:
            try:
                await self._await_try(entry.task, slot_wait, started)
            except asyncio.CancelledError:  # the caller gave up: so does the request
                entry.task.cancel()
                entry.task.add_done_callback(retrieve)
                raise
            if not entry.task.done():  # a hung server: give up on this try
                entry.task.cancel()
                entry.task.add_done_callback(retrieve)
                error = LLMError(f"{state.name}: no answer in {self.config.attempt_timeout:g} s", backend=state.name)
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

    async def _await_try(self, task: asyncio.Future, slot_wait: SlotWait, started: float) -> None:
        """Wait for one try until it is done or has been ``attempt_timeout`` seconds at
        its backend; its wait for a connection slot is not counted (a saturated healthy
        backend is not a hung one: the caller's deadline bounds that wait)."""
        limit = self.config.attempt_timeout
        if limit is None:
            await asyncio.wait([task])
            return
        loop = asyncio.get_running_loop()
        while not task.done():
            if slot_wait.since is not None:  # queued for a slot: the clock stands still
                ended = asyncio.ensure_future(slot_wait.ended.wait())
                try:
                    await asyncio.wait([task, ended], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ended.cancel()
                continue
            now = loop.time()
            left = started + limit + slot_wait.total(now) - now
            if left <= 0:
                return
            await asyncio.wait([task], timeout=left)

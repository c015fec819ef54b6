"""The trainer's requests ahead of the rollouts' work on one event loop.

A server with tens of thousands of rollouts in flight has more rollout work ready than
one core does: asyncio runs every ready callback in the order it was scheduled, so a
``GET /v1/status`` waits behind every rollout step queued before each of its own
(seconds, at 65,000 in flight: docs/benchmarks.md).

The rollouts' work runs in a context marked as background: the engine starts each
rollout's task in one (``background_context``), and so does a re-scoring; a harness's
call to the gateway marks its request's task (``enter_background``), and a gateway
socket a rollout opens serves in the rollout's context. Every callback scheduled from
such a context (a task's steps, the wake-ups of what it awaits) goes to a second queue,
which ``ApiFirstLoop`` runs in slices of about ``slice_s`` seconds of wall time, one
slice each pass of the loop; the rest of the pass (the trainer's requests, the I/O,
timers, what threads hand back) runs first. A request's next step waits for the pass it
is in and one slice (which one long callback can overrun), not for every rollout step
that was ready before it. Rollouts keep every pass's time the requests do not use, in
their own order (one FIFO queue).

What is not sliced: the loop's I/O callbacks (reading a socket or a pipe, parsing what
arrived) run in the I/O phase of each pass whoever opened the transport; they only hand
data to the tasks that wait for it, and those wake as background if they are. Shared
tasks a rollout starts for everyone (the store's writers) are started in a foreground
context (``foreground_context``), so a request that awaits them does not wait behind
the rollouts. In asyncio's debug mode the loop does not slice (asyncio's own checks
apply to every callback). Where nothing marks a context (an embedded engine, tests),
the loop is asyncio's own and the marks do nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_SLICE_S",
    "MIN_SLICE_S",
    "ApiFirstLoop",
    "ApiFirstMixin",
    "background_context",
    "enter_background",
    "foreground_context",
    "in_background",
    "loop_factory",
    "slice_problem",
]

DEFAULT_SLICE_S = 0.005
"""A slice of rollout work between two passes over the requests and the I/O."""
MIN_SLICE_S = 0.0001
"""Below this a pass would run a callback or two of the rollouts' work, for the pass's own cost."""

_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("rollserve_background", default=False)
_clock = time.perf_counter


def slice_problem(ms: float) -> str | None:
    """What is wrong with a slice of ``ms`` milliseconds (``--rollout-slice-ms``; 0: off), if anything."""
    if 0 < ms < MIN_SLICE_S * 1000:
        return f"must be 0 (off) or at least {MIN_SLICE_S * 1000:g} ms"
    return None


def background_context() -> contextvars.Context:
    """A copy of the current context, marked: a task run in it is the rollouts' work."""
    context = contextvars.copy_context()
    context.run(_BACKGROUND.set, True)
    return context


def foreground_context() -> contextvars.Context:
    """A copy of the current context, unmarked: for a task every caller shares, even when
    a rollout happens to start it."""
    context = contextvars.copy_context()
    context.run(_BACKGROUND.set, False)
    return context


def enter_background() -> None:
    """Mark the running task's context (and what it starts from now on) as the
    rollouts' work: a request made on a rollout's behalf (the gateway's calls)."""
    _BACKGROUND.set(True)


def in_background() -> bool:
    """Whether the code running now is the rollouts' work."""
    return _BACKGROUND.get()


class _Deferred:
    """A callback waiting in the background queue (what ``call_soon`` returns for it)."""

    __slots__ = ("_args", "_callback", "_cancelled", "_context")

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...], context: contextvars.Context) -> None:
        self._callback: Callable[..., object] | None = callback
        self._args: tuple[Any, ...] = args
        self._context = context
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        self._callback, self._args = None, ()  # (what it held is freed now, as asyncio.Handle does)

    def cancelled(self) -> bool:
        return self._cancelled

    def __repr__(self) -> str:
        return f"<background callback {self._callback!r}{' cancelled' if self._cancelled else ''}>"


class ApiFirstMixin:
    """What makes an event loop class (``class L(ApiFirstMixin, SomeLoop)``) run the
    callbacks scheduled from a background context in slices after the rest of a pass."""

    def __init__(self, slice_s: float = DEFAULT_SLICE_S) -> None:
        if not slice_s >= MIN_SLICE_S:
            raise ValueError(f"slice_s must be at least {MIN_SLICE_S}, not {slice_s}")
        super().__init__()
        self.slice_s = slice_s
        self._background: deque[_Deferred] = deque()
        self._pumping = False
        self._slicing = not self.get_debug()  # type: ignore[attr-defined]  # (asyncio's checks in debug mode)
        self._schedule: Callable[..., asyncio.Handle] = super().call_soon  # type: ignore[misc]

    def call_soon(self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None) -> Any:
        if context is None:
            if not (_BACKGROUND.get() and self._slicing):
                return self._schedule(callback, *args)
            context = contextvars.copy_context()
        elif not (context.get(_BACKGROUND, False) and self._slicing):
            return self._schedule(callback, *args, context=context)
        if not self._pumping:
            self._schedule(self._pump)  # raises as asyncio's does once the loop is closed
            self._pumping = True
        deferred = _Deferred(callback, args, context)
        self._background.append(deferred)
        return deferred

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)  # type: ignore[misc]
        self._slicing = not enabled

    def close(self) -> None:
        self._background.clear()  # nothing runs after a close: what waited is dropped, as asyncio's ready queue
        self._pumping = False
        super().close()  # type: ignore[misc]

    @property
    def background_waiting(self) -> int:
        """Callbacks in the background queue now."""
        return len(self._background)

    def _pump(self) -> None:
        queue = self._background
        take = queue.popleft
        end = _clock() + self.slice_s
        try:
            while queue:
                deferred = take()
                if not deferred._cancelled:
                    try:
                        deferred._context.run(deferred._callback, *deferred._args)  # type: ignore[arg-type]
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:  # as asyncio.Handle does: reported, the loop goes on
                        self.call_exception_handler(  # type: ignore[attr-defined]
                            {"message": f"Exception in callback {deferred!r}", "exception": exc, "handle": deferred}
                        )
                if _clock() >= end:
                    break
        finally:
            if queue:
                self._schedule(self._pump)
            else:
                self._pumping = False


def _base_loop() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # the server runs without the `server` extra, on asyncio's loop
        return asyncio.SelectorEventLoop
    return uvloop.Loop


class ApiFirstLoop(ApiFirstMixin, _base_loop()):  # type: ignore[misc]
    """The server's loop: uvloop's where installed (else asyncio's selector loop), the
    rollouts' work in slices (``ApiFirstMixin``)."""


def loop_factory(slice_s: float = DEFAULT_SLICE_S) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the server's loop (uvicorn's ``loop``): ``ApiFirstLoop`` with ``slice_s``."""

    def new_loop() -> asyncio.AbstractEventLoop:
        return ApiFirstLoop(slice_s)

    return new_loop

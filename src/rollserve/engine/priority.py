"""The API's work ahead of the rollouts' on one event loop.

A server with tens of thousands of rollouts in flight has more rollout work ready than
one core does: asyncio runs every ready callback in the order it was scheduled, so a
``GET /v1/status`` waits behind every rollout step queued before each of its own
(seconds, at 65,000 in flight: docs/benchmarks.md).

The engine runs each rollout's task in a context marked as background
(``background_context``); every callback scheduled from that context (the task's steps,
its futures' wake-ups) goes to a second queue. ``ApiFirstLoop`` runs that queue in
slices of about ``slice_s`` seconds of CPU, one slice each pass of the loop, after the
I/O and the other callbacks of the pass: a request's next step never waits for more than
one slice of rollout work. Rollouts keep all of the loop that the API's requests do not
use, and their own order among themselves (one FIFO queue). Where nothing marks a context
(an embedded engine, tests), the loop is asyncio's own and the mark does nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_SLICE_S", "ApiFirstLoop", "background_context", "in_background", "loop_factory"]

DEFAULT_SLICE_S = 0.005
"""A slice of rollout work between two passes over the API's requests and the I/O."""

_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("rollserve_background", default=False)
_clock = time.perf_counter
_CHECK_EVERY = 8  # callbacks run between two looks at the clock (a look costs about as much as a wake-up)


def background_context() -> contextvars.Context:
    """A copy of the current context, marked: a task run in it is the rollouts' work."""
    context = contextvars.copy_context()
    context.run(_BACKGROUND.set, True)
    return context


def in_background() -> bool:
    """Whether the code running now is the rollouts' work (a task run in a
    ``background_context``, or one such a task started)."""
    return _BACKGROUND.get()


class _Deferred:
    """A callback waiting in the background queue (what ``call_soon`` returns for it)."""

    __slots__ = ("_args", "_callback", "_cancelled", "_context")

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...], context: contextvars.Context) -> None:
        self._callback = callback
        self._args = args
        self._context = context
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled

    def __repr__(self) -> str:
        return f"<background callback {self._callback!r}{' cancelled' if self._cancelled else ''}>"


def _base_loop() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # the server runs without the `server` extra, on asyncio's loop
        return asyncio.SelectorEventLoop
    return uvloop.Loop


_BaseLoop = _base_loop()
_BASE_CALL_SOON = _BaseLoop.call_soon


class ApiFirstLoop(_BaseLoop):  # type: ignore[misc,valid-type]
    """An event loop (uvloop's where installed) that runs callbacks scheduled from a
    background context in slices, after the pass's I/O and other callbacks."""

    def __init__(self, slice_s: float = DEFAULT_SLICE_S) -> None:
        super().__init__()
        if not slice_s > 0:
            raise ValueError(f"slice_s must be positive, not {slice_s}")
        self.slice_s = slice_s
        self._background: deque[_Deferred] = deque()
        self._pumping = False

    def call_soon(self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None) -> Any:
        if context is None:
            if not _BACKGROUND.get():
                return _BASE_CALL_SOON(self, callback, *args)
            context = contextvars.copy_context()
        elif not context.get(_BACKGROUND, False):
            return _BASE_CALL_SOON(self, callback, *args, context=context)
        if not self._pumping:
            _BASE_CALL_SOON(self, self._pump)  # raises as asyncio's does once the loop is closed
            self._pumping = True
        deferred = _Deferred(callback, args, context)
        self._background.append(deferred)
        return deferred

    @property
    def background_waiting(self) -> int:
        """Callbacks in the background queue now."""
        return len(self._background)

    def _pump(self) -> None:
        queue = self._background
        take = queue.popleft
        end = _clock() + self.slice_s
        ran = 0
        try:
            while queue:
                deferred = take()
                if not deferred._cancelled:
                    try:
                        deferred._context.run(deferred._callback, *deferred._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:  # as asyncio.Handle does: reported, the loop goes on
                        self.call_exception_handler(
                            {"message": f"Exception in callback {deferred!r}", "exception": exc, "handle": deferred}
                        )
                ran += 1
                if ran % _CHECK_EVERY == 0 and _clock() >= end:
                    break
        finally:
            if queue:
                _BASE_CALL_SOON(self, self._pump)
            else:
                self._pumping = False


def loop_factory(slice_s: float = DEFAULT_SLICE_S) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the server's loop (uvicorn's ``loop``): ``ApiFirstLoop`` with ``slice_s``."""

    def new_loop() -> asyncio.AbstractEventLoop:
        return ApiFirstLoop(slice_s)

    return new_loop

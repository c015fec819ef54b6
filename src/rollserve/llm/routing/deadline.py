"""The deadline of the LLM calls made in the current context (a context variable).

The engine sets it around a rollout's stages (the earliest of the stage and the
rollout deadlines); the router reads it to decide whether another try still fits.
asyncio's own ``timeout()`` still bounds every wait by cancellation; this only
lets a call fail with a typed ``LLMError`` instead of starting a retry it cannot
finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_deadline: ContextVar[float | None] = ContextVar("rollserve_llm_deadline", default=None)


def current_deadline() -> float | None:
    """Event-loop time by which calls in this context must be done (None: unbounded)."""
    return _deadline.get()


def remaining(default: float | None = None) -> float | None:
    """Seconds left before the deadline (``default`` if there is none)."""
    when = _deadline.get()
    if when is None:
        return default
    return when - asyncio.get_running_loop().time()


@contextmanager
def call_deadline(when: float | None) -> Iterator[None]:
    """Bound the LLM calls made inside by ``when`` (loop time); nests to the earliest."""
    outer = _deadline.get()
    if when is None or (outer is not None and outer <= when):
        when = outer
    token = _deadline.set(when)
    try:
        yield
    finally:
        _deadline.reset(token)

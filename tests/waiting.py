"""Bounded waits on a condition, for tests: poll until it holds or a deadline passes, then
fail naming what was awaited. Tests wait with these, never with a fixed sleep before an
assertion (``tests/test_no_fixed_sleeps.py`` holds them to it): a fixed sleep is either too
short on a loaded machine (a flaky failure) or longer than needed everywhere else."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

# Generous: the suite runs on shared, loaded machines; a condition that holds returns at once.
TIMEOUT = 10.0


def _describe(predicate: Callable[[], Any]) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return getattr(predicate, "__qualname__", repr(predicate))


def _timed_out(timeout: float, what: str | None, predicate: Callable[[], Any]) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what or _describe(predicate)}")


def wait_until(
    predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str | None = None, interval: float = 0.02
) -> Any:
    """Return ``predicate()``'s first truthy value; raise AssertionError (naming ``what``,
    or the predicate's source) if there is none within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, predicate)
        time.sleep(interval)  # sleep-ok: the poll interval of a bounded wait


async def eventually(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout: float = TIMEOUT,
    what: str | None = None,
    interval: float = 0.01,
) -> Any:
    """``wait_until`` that lets the event loop run meanwhile; ``predicate`` may be async."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, predicate)
        await asyncio.sleep(interval)  # sleep-ok: the poll interval of a bounded wait


async def settle(turns: int = 20) -> None:
    """Let every task that can run without I/O or a timer run on as far as it can (``turns``
    passes of the event loop). For a check that something did NOT happen (a call stays
    held), where the code under test involves no I/O: a positive condition to wait on
    is better where there is one."""
    for _ in range(turns):
        await asyncio.sleep(0)

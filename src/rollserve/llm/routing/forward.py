"""Forwarding the router's pause and resume to the backends that declare ``Pausable``
(vLLM dev mode, SGLang): each call bounded, its outcome reported, none blocking."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable

from rollserve.llm.base import Pausable
from rollserve.llm.routing.backend_state import BackendState


def pausable(states: Iterable[BackendState]) -> dict[str, Pausable]:
    """The backends among ``states`` that declare ``Pausable``, by name."""
    return {s.name: s.backend for s in states if isinstance(s.backend, Pausable)}


async def forward(calls: dict[str, Awaitable[None]], timeout: float) -> dict[str, str]:
    """Run the forwarded calls at once, each within ``timeout`` seconds: "ok" or the
    error, by backend name."""

    async def one(call: Awaitable[None]) -> str:
        try:
            async with asyncio.timeout(timeout):
                await call
            return "ok"
        except Exception as exc:  # report, never block the pause on one server
            return f"{type(exc).__name__}: {exc}"

    results = await asyncio.gather(*(one(c) for c in calls.values()))
    return dict(zip(calls, results, strict=True))

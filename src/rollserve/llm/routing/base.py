"""The routing package's own contracts, so its modules point one way (``router``
imports ``session`` and ``health``, never the reverse):

- ``Pinned`` and ``SessionRouter``: what a session is to the router, and what it
  asks of the router (``session.RouterSession`` holds a ``SessionRouter``);
- ``HealthTarget``: what the health monitor asks of the router.
"""

from __future__ import annotations

from typing import Protocol

from rollserve.llm.base import (
    BackendKind,
    ChatReply,
    Generation,
    Message,
    SamplingParams,
    ToolSchema,
)
from rollserve.llm.routing.backend_state import BackendState


class Pinned(Protocol):
    """A trajectory as the router tracks it: its key and the backend it is pinned to."""

    key: str
    backend: str | None  # the pinned backend's name; None before the first call


class SessionRouter(Protocol):
    """What a session asks of its router."""

    @property
    def policy_version(self) -> int | None: ...

    def states(self) -> list[BackendState]: ...

    async def generate(self, session: Pinned, prompt_ids: list[int],
                       sampling: SamplingParams) -> Generation: ...

    async def chat(self, session: Pinned, messages: list[Message], sampling: SamplingParams,
                   tools: list[ToolSchema] | None = None) -> ChatReply: ...

    async def choose_kind(self, session: Pinned) -> BackendKind: ...

    def unpin(self, session: Pinned) -> None: ...


class HealthTarget(Protocol):
    """What the health monitor asks of the router."""

    def states(self) -> list[BackendState]: ...

    def set_healthy(self, name: str, healthy: bool) -> None: ...

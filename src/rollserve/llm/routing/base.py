"""The routing package's own contracts, so its modules point one way (``router``
imports ``session`` and ``health``, never the reverse):

- ``Pinned`` and ``SessionRouter``: what a session is to the router, and what it
  asks of the router (``session.RouterSession`` holds a ``SessionRouter``);
- ``HealthTarget``: what the health monitor asks of the router;
- ``Follower``: another router that pauses, resumes and takes new weights with this
  one (a cluster node's replica, ``rollserve.cluster``).
"""

from __future__ import annotations

from typing import Protocol

from rollserve.llm.base import (
    BackendKind,
    ChatReply,
    Generation,
    Message,
    PauseMode,
    SamplingParams,
    ToolSchema,
)
from rollserve.llm.routing.backend_state import BackendState
from rollserve.llm.routing.weights import WeightUpdate


class Pinned(Protocol):
    """A trajectory as the router tracks it: its key and the backend it is pinned to."""

    key: str
    backend: str | None  # the pinned backend's name; None before the first call


class SessionRouter(Protocol):
    """What a session asks of its router."""

    @property
    def policy_version(self) -> int | None: ...

    def states(self) -> list[BackendState]: ...

    async def generate(self, session: Pinned, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def chat(
        self, session: Pinned, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None = None
    ) -> ChatReply: ...

    async def choose_kind(self, session: Pinned) -> BackendKind: ...

    def unpin(self, session: Pinned) -> None: ...


class HealthTarget(Protocol):
    """What the health monitor asks of the router."""

    def states(self) -> list[BackendState]: ...

    def set_healthy(self, name: str, healthy: bool) -> None: ...


class Follower(Protocol):
    """Routers elsewhere that sample for this one's rollouts: paused with it (``finish``:
    their calls in flight drained first) and resumed with it at its policy version."""

    async def pause(self, mode: PauseMode, timeout: float | None) -> bool:
        """Pause them; True once none has a call in flight."""
        ...

    async def resume(self, policy_version: int | None) -> None: ...

    def backend_added(self, name: str, source: str, weight: float) -> None:
        """The backend ``name`` was registered here: ``source`` is its spec (JSON), to
        build it from."""

    async def backend_removed(self, name: str, grace: float) -> None:
        """The backend ``name`` was removed here (calls in flight get ``grace`` seconds)."""

    async def weights_loaded(self, update: WeightUpdate, failed: list[str]) -> None:
        """``update`` was loaded into this router's servers (while paused, before the
        resume), by every backend but those in ``failed``: their twins there name what
        they name now (``update.lora``; None: the base model), without loading anything.
        Bounded; a router that does not confirm must not sample again (the cluster
        fences its node)."""

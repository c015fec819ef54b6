"""A trajectory's handle on the router (implements ``llm.base.LLMSession``)."""

from __future__ import annotations

from rollserve.llm.base import ChatReply, Generation, Message, SamplingParams, ToolSchema
from rollserve.llm.routing.base import SessionRouter


class RouterSession:
    """Sticky: pinned to one backend at its first call, moved only by the router."""

    def __init__(self, router: SessionRouter, key: str = ""):
        self.router = router
        self.key = key
        self.backend: str | None = None  # the pinned backend's name

    @property
    def policy_version(self) -> int | None:
        """The router's current version (each generation also carries its own stamp)."""
        return self.router.policy_version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.router.generate(self, prompt_ids, sampling)

    async def chat(
        self, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None = None
    ) -> ChatReply:
        return await self.router.chat(self, messages, sampling, tools=tools)

    def context_window(self) -> int | None:
        """The context window bounding this trajectory's prompts: its backend's, or,
        before it is pinned, the smallest among the backends it may be sent to; None
        where no such backend reports one (``LLMBackend.context_window``)."""
        usable = [s for s in self.router.states() if s.usable and s.serves("tokens")]
        states = [s for s in usable if s.name == self.backend] or usable
        windows = [w for s in states if (w := s.backend.context_window()) is not None]
        return min(windows, default=None)

    async def message_level(self) -> bool:
        """True if this trajectory runs on a message-level (not trainable) backend."""
        return await self.router.choose_kind(self) == "messages"

    def close(self) -> None:
        """The trajectory is over: it no longer counts as pinned anywhere."""
        self.router.unpin(self)

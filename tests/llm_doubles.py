"""What scripted token-level LLM sessions in the tests share: the parts of
``llm.base.LLMSession`` that a session without a chat API or a known window answers
the same way."""

from __future__ import annotations

from typing import Any


class TokenLevelSession:
    """Mixed into a scripted session that implements ``generate``."""

    async def message_level(self) -> bool:
        return False

    def context_window(self) -> int | None:
        return None

    async def chat(self, messages: Any, sampling: Any, tools: Any = None) -> Any:
        raise AssertionError("a token-level session is never asked to chat")

    def close(self) -> None:
        return None

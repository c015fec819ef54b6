"""What every inference backend offers: token ids in, token ids and logprobs out.

Message-level backends (API models that cannot take or return token ids) are
marked ``trainable = False`` and offer ``chat(messages, sampling)`` instead; the
agent loop then keeps a chat-only trajectory.

Optional, duck-typed extras a backend may have: ``pause(mode)`` / ``resume()``
(forwarded by the router around weight updates) and ``weight`` (a routing weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# The wire model (rollserve.contract); the llm layer samples with it.
from rollserve.contract import SamplingParams


@dataclass
class Generation:
    """What a backend sampled for one prompt, verbatim."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    backend: str = ""
    meta: dict = field(default_factory=dict)
    policy_version: int | None = None  # stamped by the router when it sent the request

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(
                f"backend returned {len(self.output_ids)} ids but {len(self.logprobs)} logprobs"
            )


@dataclass
class ChatReply:
    """What a message-level backend answered: text (and tool calls), no token ids."""

    content: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    tool_calls: list[dict] = field(default_factory=list)
    backend: str = ""
    usage: dict = field(default_factory=dict)  # prompt_tokens, completion_tokens
    policy_version: int | None = None


@runtime_checkable
class LLMBackend(Protocol):
    """An inference server (or in-process model) that samples from token ids.

    A message-level backend (``trainable = False``) raises on ``generate`` and
    implements ``async chat(messages, sampling, tools=None) -> ChatReply``.
    """

    name: str
    trainable: bool  # False for message-level APIs that cannot return sampled ids

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def health(self) -> bool: ...

    async def close(self) -> None: ...

    def describe(self) -> dict: ...

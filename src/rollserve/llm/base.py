"""What every inference backend offers: token ids in, token ids and logprobs out.

Message-level backends (API models that cannot take or return token ids) are
marked ``trainable = False`` and offer ``chat(messages, sampling)`` instead; the
agent loop then keeps a chat-only trajectory.

Optional, duck-typed extras a backend may have: ``pause(mode)`` / ``resume()``
(forwarded by the router around weight updates) and ``weight`` (a routing weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Sampling settings for one LLM call (one agent turn)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=2**31 - 1, description="-1 disables top-k")
    max_tokens: int = Field(512, ge=1, le=1_000_000, description="new tokens per turn")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        default_factory=list, max_length=1024)


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

"""What the prompt builders (``tokens.chat``) need of a tokenizer, in two flavours.

``TextTemplate``: a local tokenizer renders the chat template to text and encodes
it, synchronously (``ChatTokenizer``; the builder runs it on a render thread).
``IdTemplate``: the serving backend renders and tokenizes, asynchronously, and
gives ids (``BackendTokenizer``). Both tokenizers also implement ``llm.base.Tokenizer``,
the contract the rest of rollserve sees.
"""

from __future__ import annotations

from typing import Protocol

from rollserve.llm.base import Message, ToolSchema


class TextTemplate(Protocol):
    @property
    def eos_token_id(self) -> int: ...

    def render(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[ToolSchema] | None = None
    ) -> str:
        """``messages`` through the chat template, as text."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as the template wrote it: special tokens parsed, none added."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

    @property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes one token stands for (``tokens.bytes_bound``)."""
        ...

    @property
    def encodes_from_cache(self) -> bool:
        """Whether ``encode`` tokenizes only the text it has not seen (``tokens.segments``),
        so a small conversation is cheap to encode again; else it tokenizes every text whole."""
        ...


class IdTemplate(Protocol):
    @property
    def eos_token_id(self) -> int:
        """Known after ``ready()``."""
        ...

    async def ready(self) -> None: ...

    async def render_ids(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[ToolSchema] | None = None
    ) -> list[int]:
        """``messages`` through the chat template, as ids."""
        ...

    async def encode(self, text: str) -> list[int]: ...

    async def decode(self, ids: list[int]) -> str: ...

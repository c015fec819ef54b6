"""Tokens: chat templates, tokenizers (local or the serving backend's) and append-only prompts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
    from rollserve.llm.tokens.pieces import token_texts
    from rollserve.llm.tokens.tokenizer import (
        DEFAULT_TOKENIZER,
        ChatTokenizer,
        TokenizerError,
        load_tokenizer,
    )

_HOMES: dict[str, str] = {
    "BackendTokenizer": "rollserve.llm.tokens.backend_tokenizer",
    "token_texts": "rollserve.llm.tokens.pieces",
    **dict.fromkeys(
        ("ChatTokenizer", "DEFAULT_TOKENIZER", "TokenizerError", "load_tokenizer"), "rollserve.llm.tokens.tokenizer"
    ),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "BackendTokenizer",
    "ChatTokenizer",
    "DEFAULT_TOKENIZER",
    "TokenizerError",
    "load_tokenizer",
    "token_texts",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

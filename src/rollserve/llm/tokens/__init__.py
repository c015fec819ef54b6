"""Tokens: chat templates, tokenizers (local or the serving backend's) and append-only prompts."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
    **dict.fromkeys(("ChatTokenizer", "DEFAULT_TOKENIZER", "TokenizerError", "load_tokenizer"),
                    "rollserve.llm.tokens.tokenizer"),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "BackendTokenizer", "ChatTokenizer", "DEFAULT_TOKENIZER", "TokenizerError", "load_tokenizer", "token_texts",
]


def __getattr__(name: str) -> object:
    """Import a public name from its home module the first time it is asked for (so
    importing one module of this package does not import the others)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = vars(importlib.import_module(home))[name]
    globals()[name] = value
    return value

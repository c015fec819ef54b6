"""The text of single tokens (the dashboard's token view): the same from the local
tokenizer and from a serving backend's /detokenize, and bounded for the backend."""

from __future__ import annotations

import pytest

from rollserve.llm.base import TokenizerError
from rollserve.llm.tokens import pieces
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
from rollserve.llm.tokens.pieces import token_texts
from rollserve.testing import FakeVLLM

TEXT = "<|im_start|>user\nWhat is 2 + 2? Café ✓<|im_end|>\n"


async def test_each_id_alone_locally_and_through_the_backend(tok, monkeypatch):
    ids = sorted(set(tok.encode(TEXT)))
    local = await token_texts(tok, ids)
    assert local == [tok.decode([i]) for i in ids]
    assert "<|im_start|>" in local and "\n" in local
    async with FakeVLLM("smollm2") as fake:
        backend = BackendTokenizer(fake.url)
        try:
            assert await token_texts(backend, ids) == local
            asked = len(fake.calls)
            # a token's text never changes: a second view asks the backend nothing
            assert await token_texts(backend, ids[::-1]) == local[::-1]
            assert len(fake.calls) == asked
        finally:
            await backend.close()
        fresh = BackendTokenizer(fake.url)
        try:
            monkeypatch.setattr(pieces, "MAX_BACKEND_IDS", len(ids) - 1)
            with pytest.raises(TokenizerError, match="distinct tokens"):
                await token_texts(fresh, ids)
        finally:
            await fresh.close()


async def test_an_id_the_local_tokenizer_cannot_decode_is_a_tokenizer_error(tok):
    with pytest.raises(TokenizerError, match="could not decode"):
        await token_texts(tok, [10**12])

"""The text of single tokens, for a person reading a trajectory token by token (the
dashboard's token view). Each id is decoded alone: a token holding part of a
multi-byte character shows as U+FFFD."""

from __future__ import annotations

import asyncio

from rollserve.llm.base import TokenizerError
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
from rollserve.llm.tokens.tokenizer import ChatTokenizer

MAX_BACKEND_IDS = 4096  # distinct ids decoded through a serving backend, one request each
BACKEND_CONCURRENCY = 8
BACKEND_TIMEOUT = 60.0  # seconds for all of them


async def token_texts(tokenizer: ChatTokenizer | BackendTokenizer, ids: list[int]) -> list[str]:
    """The text of each id of ``ids``, in order. A local tokenizer decodes on a thread;
    a serving backend's (``vllm:URL``) answers one ``/detokenize`` per id, at most
    ``MAX_BACKEND_IDS`` of them (else a ``TokenizerError``), bounded in time."""
    if isinstance(tokenizer, ChatTokenizer):
        hf = tokenizer.hf
        texts = await asyncio.to_thread(hf.batch_decode, [[i] for i in ids])
        return [str(text) for text in texts]
    if len(ids) > MAX_BACKEND_IDS:
        raise TokenizerError(f"{len(ids)} distinct tokens: more than the {MAX_BACKEND_IDS} "
                             f"decoded one by one through {tokenizer.name}")
    gate = asyncio.Semaphore(BACKEND_CONCURRENCY)

    async def one(token: int) -> str:
        async with gate:
            return await tokenizer.decode([token])

    async with asyncio.timeout(BACKEND_TIMEOUT):
        return list(await asyncio.gather(*(one(i) for i in ids)))

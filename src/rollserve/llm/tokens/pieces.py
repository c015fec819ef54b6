"""The text of single tokens, for a person reading a trajectory token by token (the
dashboard's token view). Each id is decoded alone: a token holding part of a
multi-byte character shows as U+FFFD.

A token's text never changes, so each tokenizer keeps the texts it decoded (up to
``CACHE_IDS`` of them); through a serving backend (``vllm:URL``, one ``/detokenize``
per id) at most ``BACKEND_CONCURRENCY`` requests run at once for all viewers together,
so open dashboards never crowd the server that samples rollouts.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

from rollserve.llm.base import TokenizerError
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
from rollserve.llm.tokens.tokenizer import ChatTokenizer

MAX_BACKEND_IDS = 4096  # distinct ids not yet known, decoded through a backend per request
BACKEND_CONCURRENCY = 8  # /detokenize requests at once, per backend tokenizer
BACKEND_TIMEOUT = 60.0  # seconds for all of one request's
CACHE_IDS = 1 << 18  # texts kept per tokenizer (more than any vocabulary's ids)


@dataclass
class _Known:
    texts: dict[int, str] = field(default_factory=dict)
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(BACKEND_CONCURRENCY))

    def keep(self, ids: list[int], texts: list[str]) -> None:
        if len(self.texts) + len(ids) > CACHE_IDS:
            self.texts.clear()
        self.texts.update(zip(ids, texts, strict=True))


_KNOWN: weakref.WeakKeyDictionary[ChatTokenizer | BackendTokenizer, _Known] = weakref.WeakKeyDictionary()


async def token_texts(tokenizer: ChatTokenizer | BackendTokenizer, ids: list[int]) -> list[str]:
    """The text of each id of ``ids``, in order. A local tokenizer decodes on a thread;
    a serving backend's (``vllm:URL``) answers one ``/detokenize`` per id not decoded
    before, at most ``MAX_BACKEND_IDS`` of them (else a ``TokenizerError``), bounded in
    time. A tokenizer that cannot decode an id: ``TokenizerError``."""
    known = _KNOWN.setdefault(tokenizer, _Known())
    missing = [i for i in dict.fromkeys(ids) if i not in known.texts]
    if missing:
        known.keep(missing, await _decode(tokenizer, known, missing))
    return [known.texts[i] for i in ids]


async def _decode(tokenizer: ChatTokenizer | BackendTokenizer, known: _Known, ids: list[int]) -> list[str]:
    if isinstance(tokenizer, ChatTokenizer):
        hf = tokenizer.hf
        try:
            texts = await asyncio.to_thread(hf.batch_decode, [[i] for i in ids])
        except Exception as exc:  # an id outside the vocabulary, a broken tokenizer
            raise TokenizerError(
                f"{tokenizer.name} could not decode the token ids: {type(exc).__name__}: {exc}"
            ) from exc
        return [str(text) for text in texts]
    if len(ids) > MAX_BACKEND_IDS:
        raise TokenizerError(
            f"{len(ids)} distinct tokens: more than the {MAX_BACKEND_IDS} decoded one by one through {tokenizer.name}"
        )

    async def one(token: int) -> str:
        async with known.gate:
            return await tokenizer.decode([token])

    async with asyncio.timeout(BACKEND_TIMEOUT):
        return list(await asyncio.gather(*(one(i) for i in ids)))

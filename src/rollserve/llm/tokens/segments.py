"""Exact encoding by segments, each segment's ids kept: a conversation's text is
tokenized once per distinct piece, not once per prompt and again for the check.

A Hugging Face tokenizer first cuts the text at its added tokens (``<|im_start|>``,
``<|im_end|>``, ...: each becomes its own id), then tokenizes every piece between
them on its own. Where nothing else looks across those cuts (no normalizer; a
pre-tokenizer of byte-level, digit or regex splits only, with no prefix space added
to the text's first piece; added tokens that strip no neighbouring spaces and need no
word boundary; BPE without dropout; no truncation or padding), the ids of a text are
exactly its pieces' ids laid end to end. ``SegmentEncoder.for_tokenizer`` accepts a
tokenizer only when its configuration says so, and ``encode`` then cuts the text
the way the tokenizer does (the tokens matched on the raw text first, then the rest,
each leftmost-longest) and looks every piece up in a bounded cache before encoding
it. A tokenizer it does not accept keeps encoding whole texts
(``ChatTokenizer.encode``).

The cache is bounded by the memory it holds (``CACHE_BYTES``: each piece's text, its
ids as 4-byte ints, the entry; ``tokens.lru``), not by characters: the policy decides
what text comes back, and a character can be four ids. The search for added tokens is
a Python regex, which holds the GIL while it scans: it scans at most ``SEARCH_CHARS``
at a time, so a render thread cutting a megabyte of ``<|<|<|...`` lets the event loop
in between windows instead of stalling it for the whole text. ``tests/llm/test_token_segments.py`` holds the ids to
the tokenizer's own on tricky text.

Why: the system prompt, the question and the retry message repeat across the ``n``
samples of a task and across turns, and the fidelity check re-tokenizes the whole
conversation at the end; with the pieces cached, only text never seen before costs
the tokenizer's ~2 us a token.
"""

from __future__ import annotations

import json
import re
from array import array
from typing import Any

from rollserve.llm.tokens.lru import SizedLRU, compact, id_bytes

CACHE_BYTES = 32 << 20  # memory the cached pieces (text, ids, entries) may hold per tokenizer
PIECE_CHARS = 1 << 16  # a piece longer than this is encoded every time (never cached)
# A piece up to this long is encoded by the call that holds the GIL (a millisecond or
# two, less than releasing and taking it back); a longer one by the batch call, which
# releases it, so a render thread tokenizing a long text never stalls the event loop.
HOLD_GIL_CHARS = 4096
# One search for added tokens scans at most this much text (or twice the longest token):
# ~1 ms with the GIL held for 256 Llama-3-style tokens over ``<|<|<|...`` (a whole
# 64K-character text: 15 ms in one hold; 4 MB with the default tokenizer: 96 ms).
SEARCH_CHARS = 4096

# Pre-tokenizers that act on each piece alone, adding nothing at its start.
_PIECEWISE = {"Digits", "Split", "Punctuation", "Whitespace", "WhitespaceSplit"}


def _pre_tokenizer_ok(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_ok(p) for p in spec.get("pretokenizers") or [])
    if kind == "ByteLevel":
        return spec.get("add_prefix_space") is False
    return kind in _PIECEWISE


def _splittable(config: dict[str, Any], backend: Any) -> bool:
    """Whether the tokenizer's configuration makes a text's ids its pieces' ids."""
    model = config.get("model") or {}
    added = config.get("added_tokens") or []
    return (
        config.get("normalizer") is None
        and _pre_tokenizer_ok(config.get("pre_tokenizer"))
        and model.get("type") == "BPE"
        and model.get("dropout") in (None, 0, 0.0)
        and config.get("truncation") is None
        and config.get("padding") is None
        and not getattr(backend, "encode_special_tokens", False)
        and all(
            not t.get("lstrip") and not t.get("rstrip") and not t.get("single_word") and t.get("content") for t in added
        )
    )


def _alternation(tokens: list[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``tokens``, leftmost-longest (longest tried first)."""
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(set(tokens), key=len, reverse=True)))


class SegmentEncoder:
    """``encode(text)``: the tokenizer's ids for ``text``, from cached pieces."""

    def __init__(self, backend: Any, added: list[dict[str, Any]]):
        self._backend = backend  # a ``tokenizers.Tokenizer``
        self._ids = {t["content"]: int(t["id"]) for t in added}
        self._longest = max((len(t["content"]) for t in added), default=1)
        # The tokenizer matches tokens marked not normalized on the raw text, then the
        # others on what is left (the same text here: there is no normalizer).
        self._raw = _alternation([t["content"] for t in added if not t.get("normalized")])
        self._normalized = _alternation([t["content"] for t in added if t.get("normalized")])
        self._cache: SizedLRU[str, array[int]] = SizedLRU(CACHE_BYTES, id_bytes)

    @classmethod
    def for_tokenizer(cls, hf: Any) -> SegmentEncoder | None:
        """The encoder for a transformers fast tokenizer ``hf``, or None where its
        pieces are not tokenized independently (or it is not a fast tokenizer)."""
        backend = getattr(hf, "backend_tokenizer", None) or getattr(hf, "_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            return None
        try:
            config = json.loads(backend.to_str())
        except (TypeError, ValueError):
            return None
        if not _splittable(config, backend):
            return None
        return cls(backend, list(config.get("added_tokens") or []))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece, token in self._cut(text):
            if token:
                ids.append(self._ids[piece])
            else:
                ids.extend(self._piece(piece))
        return ids

    def _cut(self, text: str) -> list[tuple[str, bool]]:
        """``text`` as (piece, is an added token) in order, empty pieces left out."""
        parts = _split(text, self._raw, self._longest)
        if self._normalized is None:
            return parts
        out: list[tuple[str, bool]] = []
        for piece, token in parts:
            out.extend([(piece, True)] if token else _split(piece, self._normalized, self._longest))
        return out

    def _piece(self, piece: str) -> array[int] | list[int]:
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        if len(piece) <= HOLD_GIL_CHARS:
            fresh = self._backend.encode(piece, add_special_tokens=False).ids
        else:  # (the batch call releases the GIL while it works: the loop goes on meanwhile)
            fresh = self._backend.encode_batch([piece], add_special_tokens=False)[0].ids
        if len(piece) <= PIECE_CHARS:
            self._cache.put(piece, compact(fresh))
        return fresh


def _split(text: str, pattern: re.Pattern[str] | None, longest: int) -> list[tuple[str, bool]]:
    """``text`` cut at ``pattern``'s matches (leftmost, longest first; no token longer
    than ``longest``), searched a window of at most ``SEARCH_CHARS`` at a time."""
    if pattern is None:
        return [(text, False)] if text else []
    out: list[tuple[str, bool]] = []
    at = start = 0  # text before ``at`` is cut; the next search starts at ``start``
    size, window = len(text), max(SEARCH_CHARS, 2 * longest)
    while start < size:
        end = min(size, start + window)
        match = pattern.search(text, start, end)
        if end < size and (match is None or match.start() > end - longest):
            # None here, or one that a longer token running past ``end`` might beat:
            # the tokens that could start from here on are searched in the next window.
            start = end - longest + 1
            continue
        if match is None:
            break
        if match.start() > at:
            out.append((text[at : match.start()], False))
        out.append((match.group(), True))
        at = start = match.end()
    if at < size:
        out.append((text[at:], False))
    return out

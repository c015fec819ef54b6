"""A proven lower bound on how many tokens a text takes, without tokenizing it.

Every token a tokenizer emits stands for a piece of the (normalized) text, and that
piece is one of its vocabulary's entries. Written as the vocabulary writes it (GPT-2's
byte-level characters, SentencePiece's ``▁``, byte-fallback ``<0x0A>``, an added or
special token's content), an entry takes at least as many UTF-8 bytes as the text it
stands for; with a byte-level decoder each character of a (not added) entry is
exactly one byte of text, so there its length in characters is that count. So with
``L`` the longest entry so counted, a normalized text of ``B`` bytes takes at least
``ceil(B / L)`` tokens.

Normalization may shrink the text first: none leaves it as it is (factor 1). Over
every Unicode code point (``tests/llm/test_bytes_bound.py`` checks it with
``unicodedata``), a canonical decomposition takes at least 1/3 of the bytes of what
it decomposes (KELVIN SIGN, 3 bytes, is K, 1), a compatibility one at least 1/4 (a
4-byte mathematical letter is an ASCII one), and composing gives at least 1/3 of the
bytes of the decomposed form (a Hangul syllable from three 3-byte jamo): so NFD
shrinks a text at most 3 times, NFKD 4, NFC 3*3 = 9, NFKC 4*3 = 12. Prepending,
or a replacement by a string at least as long, never shrinks it. Any other
normalizer (lowercasing, stripping, removing control characters...) has no bound we
can prove, and then there is none (None). ``max_token_bytes`` is ``L`` times that
factor: a text of ``B`` bytes takes at least ``ceil(B / max_token_bytes)`` tokens.

For SmolLM2's tokenizer (byte-level BPE, no normalizer) it is the longest entry of its
vocabulary; ``tests/llm/test_bytes_bound.py`` checks the bound against the real
tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["max_token_bytes", "min_tokens", "normalizer_factor"]

_UNICODE = {"NFD": 3, "NFKD": 4, "NFC": 9, "NFKC": 12}


def normalizer_factor(normalizer: dict[str, Any] | None) -> int | None:
    """How many times shorter (in UTF-8 bytes) ``normalizer`` (a tokenizer.json
    ``normalizer`` entry) may make a text, or None when that cannot be bounded."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind in _UNICODE:
        return _UNICODE[kind]
    if kind == "Prepend":
        return 1
    if kind == "Replace":
        pattern = normalizer.get("pattern") or {}
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        content = normalizer.get("content")
        if (
            isinstance(literal, str)
            and literal
            and isinstance(content, str)
            and len(content.encode("utf-8")) >= len(literal.encode("utf-8"))
        ):
            return 1
        return None
    if kind == "Sequence":
        factor = 1
        for part in normalizer.get("normalizers") or []:
            step = normalizer_factor(part)
            if step is None:
                return None
            factor *= step
        return factor
    return None


def max_token_bytes(hf_tokenizer: Any) -> int | None:
    """``L`` times the normalizer's factor for a transformers fast tokenizer (see the
    module's doc); None when it has no Rust backend or its normalizer is unbounded."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if not _keeps_every_byte(spec):
        return None
    factor = normalizer_factor(spec.get("normalizer"))
    if factor is None:
        return None
    added = {str(getattr(a, "content", a)) for a in getattr(hf_tokenizer, "added_tokens_decoder", {}).values()}
    byte_level = _byte_level(spec.get("decoder"))
    longest = 0
    for entry in [*hf_tokenizer.get_vocab(), *added]:
        size = len(entry) if byte_level and entry not in added else len(entry.encode("utf-8"))
        longest = max(longest, size)
    return longest * factor if longest > 0 else None


# Pre-tokenizers that split text without dropping any of it.
_KEEPING = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "UnicodeScripts"})


def _keeps_every_byte(spec: dict[str, Any]) -> bool:
    """Whether every byte of a text ends up in some token no longer than the vocabulary's
    longest entry: a BPE model (WordPiece's and Unigram's unknown token stands for a whole
    word or run, ``fuse_unk`` merges unknown characters into one), and pre-tokenizers that
    drop nothing (``Whitespace``/``BertPreTokenizer`` drop spaces; ``Removed`` splits drop
    what they match). Anything else proves no bound."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("fuse_unk"):
        return False
    stack = [spec.get("pre_tokenizer")]
    while stack:
        part = stack.pop()
        if part is None:
            continue
        if part.get("type") == "Sequence":
            stack += part.get("pretokenizers") or []
        elif part.get("type") not in _KEEPING or part.get("behavior") in ("Removed", "removed"):
            return False
    return True


def _byte_level(decoder: dict[str, Any] | None) -> bool:
    """Whether ``decoder`` maps each character of an entry to one byte (GPT-2's)."""
    if decoder is None:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    if decoder.get("type") == "Sequence":
        parts = decoder.get("decoders") or []
        return len(parts) == 1 and _byte_level(parts[0])
    return False


def min_tokens(text_bytes: int, token_bytes: int) -> int:
    """The fewest tokens a text of ``text_bytes`` bytes can take."""
    return -(-text_bytes // token_bytes)

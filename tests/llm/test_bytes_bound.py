"""The bound a prompt is refused on before it is tokenized (``tokens.bytes_bound``):
a text of B bytes takes at least ceil(B / max_token_bytes) tokens. Checked against
Unicode's own data (the normalizers' factors) and against the real tokenizer."""

from __future__ import annotations

import random
import sys
import unicodedata

import pytest

from rollserve.llm.base import PromptOverBudget
from rollserve.llm.tokens.bytes_bound import min_tokens, normalizer_factor


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def test_the_normalizer_factors_hold_for_every_code_point():
    """Per code point: canonical decomposition keeps at least 1/3 of the bytes, a
    compatibility one 1/4, and composing a decomposed form keeps at least 1/3."""
    worst = {"NFD": 1.0, "NFKD": 1.0, "compose": 1.0}
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        size = _size(c)
        for form in ("NFD", "NFKD"):
            worst[form] = max(worst[form], size / _size(unicodedata.normalize(form, c)))
        decomposed = unicodedata.normalize("NFD", c)
        worst["compose"] = max(worst["compose"], _size(decomposed) / size)
    assert worst["NFD"] <= 3 and worst["NFKD"] <= 4 and worst["compose"] <= 3, worst
    assert normalizer_factor({"type": "NFC"}) >= worst["NFD"] * worst["compose"]
    assert normalizer_factor({"type": "NFKC"}) >= worst["NFKD"] * worst["compose"]
    assert normalizer_factor(None) == 1
    assert normalizer_factor({"type": "Lowercase"}) is None  # (no bound proven: none used)
    assert (
        normalizer_factor(
            {
                "type": "Sequence",
                "normalizers": [
                    {"type": "Prepend", "prepend": "▁"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                ],
            }
        )
        == 1
    )
    assert normalizer_factor({"type": "Replace", "pattern": {"String": "abc"}, "content": ""}) is None


def test_no_text_takes_fewer_tokens_than_its_bytes_prove(tok):
    per_token = tok.max_token_bytes
    # Byte-level BPE: each character of an entry is one byte of text.
    assert per_token is not None and per_token >= max(len(t) for t in tok.hf.get_vocab())
    longest = max(tok.hf.get_vocab().items(), key=lambda item: len(item[0]))
    assert _size(tok.decode([longest[1]])) <= per_token  # (81 bytes of newline and spaces)
    rng = random.Random(7)
    vocab = list(tok.hf.get_vocab())
    pieces = ["<|im_start|>", "<|im_end|>", " ", "\n", "é", "中文", "🙂", "\u0301", "x" * 50]
    for _ in range(300):  # texts made of the longest entries are the worst case
        text = "".join(rng.choice(vocab + pieces) for _ in range(rng.randint(1, 40)))
        text = tok.decode(tok.encode(text))  # (as text a harness could send)
        assert len(tok.encode(text)) >= min_tokens(_size(text), per_token), text


def test_the_builder_refuses_a_prompt_its_bytes_prove_too_long_without_encoding(tok, monkeypatch):
    builder = tok.prompt_builder()
    builder.max_prompt_tokens = 100
    encoded: list[str] = []
    monkeypatch.setattr(type(tok), "encode", lambda self, text: encoded.append(text) or [1])
    with pytest.raises(PromptOverBudget) as over:
        builder.first([{"role": "user", "content": "z" * (tok.max_token_bytes * 101)}])
    assert over.value.at_least > 100 and encoded == []
    builder.first([{"role": "user", "content": "short"}])  # may fit: tokenized
    assert len(encoded) == 1


def _fast(tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_tokenizers_whose_tokens_can_stand_for_unbounded_text_prove_no_bound():
    """WordPiece's unknown token stands for a whole word, a Whitespace pre-tokenizer drops
    every space, Unigram's unknown token a whole run: one token for 10,000 bytes each, so
    no bytes-per-token bound holds (a prompt that fits would be refused)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rollserve.llm.tokens.bytes_bound import max_token_bytes

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    assert len(wordpiece.encode("a" + " " * 10_000).ids) == 1
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0))
    assert len(unigram.encode("z" * 10_000).ids) == 1
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    for tokenizer in (wordpiece, unigram, bpe):
        assert max_token_bytes(_fast(tokenizer)) is None
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()  # keeps every byte: bounded
    assert max_token_bytes(_fast(bpe)) is not None

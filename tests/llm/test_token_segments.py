"""Encoding by cached segments (``llm.tokens.segments``) gives exactly the tokenizer's
own ids, on text chosen to break a shortcut, and is refused for tokenizers whose
pieces are not tokenized independently."""

from __future__ import annotations

import gc
import random
import sys
import tracemalloc

import pytest

from rollserve.llm.tokens import segments
from rollserve.llm.tokens.segments import SegmentEncoder

TRICKY = [
    "",
    " ",
    "\n\n\n",
    "a",
    "<|im_start|>",
    "<|im_start|><|im_end|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n  leading spaces and trailing   <|im_end|>",
    "text<|im_end|>text",  # a special token between letters
    " <|im_end|> ",  # ... between spaces (no token here strips them)
    "<|im_end",  # half a special token is text
    "<|im_end|",
    "|im_end|>",
    "<<|im_end|>>",
    "<|im_start|<|im_end|>",
    "<|endoftext|><|endoftext|><|endoftext|>",
    "12345678901234567890 + 3.14159 = ?",
    "  2  +  2 ",
    "tabs\tand\r\nwindows\r\nnewlines\r",
    "naïve café, Zürich — “quotes” ‘single’ … ½ ² ³",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 👩‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 👍🏽",
    "combining: e\u0301 a\u0308 n\u0303; zero width: a\u200bb\u200dc; bom \ufeff",
    "Arabic ١٢٣ and Devanagari १२३ digits",
    "\\boxed{\\frac{1}{2}} $x^2$ {{ jinja }} {% raw %}",
    "word" * 200,
    " " * 300 + "x",
    "'s 't 're 've 'm 'll 'd",
]


def _alphabet(tok) -> list[str]:
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end", "|>", "<|"]
    return [*specials, " ", "  ", "\n", "\t", "a", "b", "the", " cat", "1", "23", "é", "日", "👍", "\u200d", "'s", "."]


def test_the_default_tokenizer_is_encoded_by_segments(tok):
    assert tok._segments is not None


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_gets_the_tokenizers_own_ids(tok, text):
    expected = list(tok.hf.encode(text, add_special_tokens=False))
    assert tok.encode(text) == expected
    assert tok.encode(text) == expected  # again, every piece from the cache now


def test_random_text_gets_the_tokenizers_own_ids(tok):
    rng = random.Random(25)
    alphabet = _alphabet(tok)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert tok.encode(text) == list(tok.hf.encode(text, add_special_tokens=False)), repr(text)


def test_rendered_conversations_get_the_tokenizers_own_ids(tok):
    messages = [
        {"role": "system", "content": "You are <|im_start|>not a token here? it is one."},
        {"role": "user", "content": "What is 7 + 5?  \n\n 日本 👍"},
        {"role": "assistant", "content": "<|im_end|>\n12<|endoftext|>"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": " \\boxed{12} "},
    ]
    for end in range(1, len(messages) + 1):
        for gen in (False, True):
            text = tok.render(messages[:end], add_generation_prompt=gen)
            assert tok.encode(text) == list(tok.hf.encode(text, add_special_tokens=False))


def _bpe(pre_tokenizer=None, normalizer=None):
    """A small BPE tokenizer over bytes, with two special tokens."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    if normalizer is not None:
        bpe.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<s>", "</s>"], show_progress=False)
    bpe.train_from_iterator(["hello world", "the cat sat", "hello there"] * 20, trainer)
    bpe.add_special_tokens([AddedToken("<s>", normalized=False), AddedToken("</s>", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def test_a_byte_level_tokenizer_is_accepted_and_exact():
    hf = _bpe()
    encoder = SegmentEncoder.for_tokenizer(hf)
    assert encoder is not None
    for text in ["<s>hello world</s>", "hello<s>world", " the cat </s> sat ", "</s></s>x"]:
        assert encoder.encode(text) == list(hf.encode(text, add_special_tokens=False))


def test_a_tokenizer_that_prefixes_the_first_piece_is_refused():
    """Metaspace adds "▁" before the text's first piece only: the pieces' ids laid
    end to end differ from the text's, so such a tokenizer must not be accepted."""
    from tokenizers import pre_tokenizers

    hf = _bpe(pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="first"))
    assert SegmentEncoder.for_tokenizer(hf) is None
    backend = hf.backend_tokenizer
    forced = SegmentEncoder(backend, [{"content": "<s>", "id": hf.convert_tokens_to_ids("<s>")}])
    text = "hello<s>world"
    assert forced.encode(text) != list(hf.encode(text, add_special_tokens=False))  # why it is refused


def test_a_normalizer_or_a_space_stripping_token_is_refused():
    from tokenizers import AddedToken, normalizers

    assert SegmentEncoder.for_tokenizer(_bpe(normalizer=normalizers.Lowercase())) is None
    hf = _bpe()
    hf.backend_tokenizer.add_special_tokens([AddedToken("<x>", lstrip=True, normalized=False)])
    assert SegmentEncoder.for_tokenizer(hf) is None
    text = "a <x> b"
    assert hf.encode(text, add_special_tokens=False) != [
        *hf.encode("a ", add_special_tokens=False),
        hf.convert_tokens_to_ids("<x>"),
        *hf.encode(" b", add_special_tokens=False),
    ]  # lstrip ate the space: pieces would be wrong


def _held(encoder: SegmentEncoder) -> int:
    """The bytes the cache's keys and ids take, counted here."""
    return sum(sys.getsizeof(piece) + sys.getsizeof(ids) for piece, ids in encoder._cache.items())


def test_the_cache_stays_within_its_bound(tok, monkeypatch):
    monkeypatch.setattr(segments, "CACHE_BYTES", 2000)
    encoder = SegmentEncoder.for_tokenizer(tok.hf)
    assert encoder is not None
    for i in range(200):
        text = f"<|im_start|>user\nquestion number {i} " + "x" * (i % 17) + "<|im_end|>"
        assert encoder.encode(text) == list(tok.hf.encode(text, add_special_tokens=False))
        assert 0 < _held(encoder) <= encoder._cache.total <= 2000


def test_a_policys_wide_characters_cannot_grow_the_cache_past_its_bound(tok, monkeypatch):
    """The policy decides the text the fidelity check encodes: 4-byte characters are ~4
    ids each. The bound counts the ids' memory, so the memory the cache holds, measured
    by tracemalloc, stays within it (a bound on characters held ~40 bytes a character)."""
    bound = 1 << 20
    monkeypatch.setattr(segments, "CACHE_BYTES", bound)
    encoder = SegmentEncoder.for_tokenizer(tok.hf)
    assert encoder is not None
    rng = random.Random(26)
    wide = [chr(c) for c in range(0x1F300, 0x1F6FF)]
    texts = ["<|im_start|>assistant\n" + "".join(rng.choices(wide, k=3000)) + "<|im_end|>" for _ in range(60)]
    assert encoder.encode(texts[0]) == list(tok.hf.encode(texts[0], add_special_tokens=False))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts[1:]:
            encoder.encode(text)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    pieces = encoder._cache.items()
    assert 1 < len(pieces) < 59 and sum(len(ids) for _, ids in pieces) > 2 * sum(len(p) for p, _ in pieces)
    assert _held(encoder) <= encoder._cache.total <= bound
    assert grown <= bound * 1.1, grown


def test_a_piece_too_long_to_keep_gets_the_same_ids_and_is_not_kept(tok, monkeypatch):
    """Past ``HOLD_GIL_CHARS`` a piece is encoded by the call that releases the GIL (so a
    huge prompt on a render thread never stalls the loop: tests/api/test_render_off_loop.py),
    and past ``PIECE_CHARS`` it is never cached."""
    monkeypatch.setattr(segments, "PIECE_CHARS", 10)
    monkeypatch.setattr(segments, "HOLD_GIL_CHARS", 5)
    encoder = SegmentEncoder.for_tokenizer(tok.hf)
    assert encoder is not None
    for text in TRICKY:
        assert encoder.encode(text) == list(tok.hf.encode(text, add_special_tokens=False)), repr(text)
    assert all(len(piece) <= 10 for piece, _ in encoder._cache.items())


@pytest.mark.parametrize("window", [1, 20, 27, 40])
def test_added_tokens_are_found_across_search_windows(tok, monkeypatch, window):
    """The search for added tokens goes a window at a time: a token across a window's
    edge, or a shorter one inside it where a longer one runs past it, is cut as the
    tokenizer cuts it (the window is at least twice the longest token)."""
    monkeypatch.setattr(segments, "SEARCH_CHARS", window)
    encoder = SegmentEncoder.for_tokenizer(tok.hf)
    assert encoder is not None
    rng = random.Random(window)
    alphabet = _alphabet(tok)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        assert encoder.encode(text) == list(tok.hf.encode(text, add_special_tokens=False)), repr(text)
    for text in TRICKY:
        assert encoder.encode(text) == list(tok.hf.encode(text, add_special_tokens=False)), repr(text)


def test_a_shorter_token_inside_a_window_does_not_beat_a_longer_one_past_its_edge(monkeypatch):
    from tokenizers import AddedToken

    monkeypatch.setattr(segments, "SEARCH_CHARS", 1)  # windows of twice the longest token

    hf = _bpe()
    hf.backend_tokenizer.add_special_tokens([AddedToken("<a>", normalized=False)])
    hf.backend_tokenizer.add_special_tokens([AddedToken("<a>long-token</a>", normalized=False)])
    encoder = SegmentEncoder.for_tokenizer(hf)
    assert encoder is not None and encoder._longest == len("<a>long-token</a>")
    for pad in range(0, 80):
        text = "x" * pad + "<a>long-token</a>" + "y" * 5 + "<a>z"
        assert encoder.encode(text) == list(hf.encode(text, add_special_tokens=False)), pad


class Recording:
    """A compiled pattern that notes how much text each search scans."""

    def __init__(self, pattern):
        self.pattern = pattern
        self.spans: list[int] = []

    def search(self, text, pos, endpos):
        self.spans.append(endpos - pos)
        return self.pattern.search(text, pos, endpos)


def test_a_long_text_is_searched_a_bounded_window_at_a_time(tok):
    """A Python regex holds the GIL while it scans: 4 MB of "<|" took 185 ms in one
    scan. Each scan here covers at most SEARCH_CHARS, so a render thread cutting it
    lets the event loop in between (tests/api/test_render_off_loop.py)."""
    encoder = SegmentEncoder.for_tokenizer(tok.hf)
    assert encoder is not None
    encoder._raw = Recording(encoder._raw)
    text = "<|" * 100_000 + "<|im_end|>" + "<|" * 50_000
    assert encoder.encode(text) == list(tok.hf.encode(text, add_special_tokens=False))
    spans = encoder._raw.spans
    assert len(spans) > len(text) // segments.SEARCH_CHARS and max(spans) <= segments.SEARCH_CHARS

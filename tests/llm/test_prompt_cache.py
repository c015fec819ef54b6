"""Where a local prompt builder does its work (``tokens.chat``): rendering and tokenizing
on a render thread, never the event loop; the opening prompt rendered and tokenized once
per distinct conversation and tools, and never served past the prompt budget."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import pytest

from rollserve.llm.base import PromptOverBudget
from rollserve.llm.tokens import chat
from rollserve.llm.tokens.chat import LocalPromptBuilder
from rollserve.llm.tokens.lru import compact, id_bytes


class Counting:
    """The real tokenizer, counting renders and noting the thread each ran on."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.renders = 0
        self.threads: set[str] = set()

    def render(self, messages, add_generation_prompt, tools=None):
        self.renders += 1
        self.threads.add(threading.current_thread().name)
        return self.tok.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode(self, text):
        return self.tok.encode(text)

    def decode(self, ids, skip_special_tokens=False):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def eos_token_id(self):
        return self.tok.eos_token_id

    @property
    def max_token_bytes(self):
        return self.tok.max_token_bytes

    @property
    def encodes_from_cache(self):
        return self.tok.encodes_from_cache


def _question(text: str) -> list:
    return [{"role": "system", "content": "Answer in \\boxed{}."}, {"role": "user", "content": text}]


async def test_the_same_opening_prompt_is_rendered_once_and_equals_a_fresh_render(tok):
    counting = Counting(tok)
    fresh = LocalPromptBuilder(tok).first(_question("What is 2 + 2?"))
    ids = [await LocalPromptBuilder(counting).afirst(_question("What is 2 + 2?")) for _ in range(4)]
    assert ids == [fresh] * 4 and counting.renders == 1
    ids[0].append(7)  # a caller's list is its own: the cache is not changed through it
    assert await LocalPromptBuilder(counting).afirst(_question("What is 2 + 2?")) == fresh
    other = await LocalPromptBuilder(counting).afirst(_question("What is 3 + 3?"))
    assert other != fresh and counting.renders == 2
    # The same messages offered tools are another prompt, not the cached one.
    tools = [
        {
            "type": "function",
            "function": {"name": "calc", "description": "adds", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    await LocalPromptBuilder(counting, tools=tools).afirst(_question("What is 2 + 2?"))
    assert counting.renders == 3


async def test_a_cached_prompt_past_the_budget_is_refused_as_an_uncached_one_is(tok):
    counting = Counting(tok)
    long = _question("x " * 1500)  # (small enough to be cached)
    ids = await LocalPromptBuilder(counting).afirst(long)  # cached, with no budget
    small = LocalPromptBuilder(counting)
    small.max_prompt_tokens = 10  # (its bytes alone prove it past that)
    assert len(ids) > 10
    with pytest.raises(PromptOverBudget):
        await small.afirst(long)


async def test_a_large_opening_prompt_is_not_kept(tok):
    """A harness's megabyte prompt would make the cache a memory hole: only prompts of
    at most INLINE_CHARS characters are kept."""
    counting = Counting(tok)
    big = _question("z " * chat.INLINE_CHARS)
    first = await LocalPromptBuilder(counting).afirst(big)
    assert await LocalPromptBuilder(counting).afirst(big) == first and counting.renders == 2


async def test_the_cache_is_bounded(tok, monkeypatch):
    counting = Counting(tok)
    first = await LocalPromptBuilder(counting).afirst(_question("q0"))
    key = LocalPromptBuilder(counting)._first_key(_question("q0"))
    entry = id_bytes(key, compact(first))  # (the q0..q4 entries cost the same)
    monkeypatch.setattr(chat, "FIRST_CACHE_BYTES", 3 * entry)
    monkeypatch.setattr(chat, "_first_caches", weakref.WeakKeyDictionary())
    counting.renders = 0
    for i in range(5):
        await LocalPromptBuilder(counting).afirst(_question(f"q{i}"))
    assert counting.renders == 5
    await LocalPromptBuilder(counting).afirst(_question("q0"))  # dropped: rendered again
    await LocalPromptBuilder(counting).afirst(_question("q4"))  # kept
    assert counting.renders == 6
    cache = chat._first_caches[counting]
    assert len(cache) == 3 and cache.total <= 3 * entry


async def test_a_policys_wide_characters_cannot_grow_the_opening_prompt_cache_past_its_bound(tok, monkeypatch):
    """Each character of 4-byte text is ~4 ids: the bound counts the ids' memory (4
    bytes each here, ~36 as a tuple of ints), so prompts of them are dropped in time."""
    monkeypatch.setattr(chat, "FIRST_CACHE_BYTES", 256 * 1024)
    monkeypatch.setattr(chat, "_first_caches", weakref.WeakKeyDictionary())
    counting = Counting(tok)
    for i in range(40):
        await LocalPromptBuilder(counting).afirst(_question(f"{i} " + "\U0001f600\U0001f9e0" * 900))
    cache = chat._first_caches[counting]
    held = sum(sys.getsizeof(key) + sys.getsizeof(ids) for key, ids in cache.items())
    assert 0 < len(cache) < 40 and held <= cache.total <= 256 * 1024
    assert sum(len(ids) for _, ids in cache.items()) > 8 * 1024  # ids many more than the characters


async def test_a_large_opening_prompt_renders_on_a_render_thread_and_a_cached_one_is_served_on_the_loop(tok):
    counting = Counting(tok)
    loop_thread = threading.current_thread().name
    builder = LocalPromptBuilder(counting)
    history = _question("What is 12 + 12?" + " pad" * (chat.INLINE_RENDER_BYTES // 4))
    sequence = await builder.afirst(history)  # rendered (on a render thread)
    assert counting.renders == 1 and loop_thread not in counting.threads
    assert all(t.startswith("rollserve-render") for t in counting.threads)
    renders = counting.renders
    again = await LocalPromptBuilder(counting).afirst(list(history))
    assert again == sequence and counting.renders == renders  # found, not rendered
    assert loop_thread not in counting.threads


async def test_a_small_opening_prompt_renders_on_the_loop_with_the_ids_a_thread_gives(tok):
    """Under ``INLINE_RENDER_BYTES`` the opening prompt is rendered and tokenized on the
    loop (less than the hop to a thread); the ids are those of a render thread's work,
    and of a tokenizer that encodes whole texts (which always leaves the loop)."""
    loop_thread = threading.current_thread().name
    counting, whole = Counting(tok), Whole(tok)
    small = _question("What is 31 + 11? \u00e9\U0001f600 and more")
    on_loop = await LocalPromptBuilder(counting).afirst(small)
    assert counting.renders == 1 and counting.threads == {loop_thread}
    off = await LocalPromptBuilder(whole).afirst(list(small))
    assert whole.renders == 1 and loop_thread not in whole.threads
    assert on_loop == off == tok.encode(tok.render(small, add_generation_prompt=True))


async def test_a_small_conversations_delta_and_check_run_on_the_loop_a_large_ones_on_a_thread(tok):
    """Up to ``INLINE_RENDER_BYTES`` of text (with the tools) a delta and a check cost
    less than the hop to a thread; past it they leave the loop, so a long conversation
    never stalls it. Either way the ids are the same."""
    loop_thread = threading.current_thread().name
    ids = {}
    for size in (100, chat.INLINE_RENDER_BYTES + 1):
        counting = Counting(tok)
        builder = LocalPromptBuilder(counting)
        history = _question("What is 12 + 12?" + " pad" * (size // 4))
        sequence = await builder.afirst(history)
        history = [*history, {"role": "assistant", "content": "24"}]
        sequence = sequence + tok.encode("24<|im_end|>")
        counting.threads.clear()
        delta = await builder.adelta(history, [{"role": "user", "content": "Sure?"}], sequence)
        fidelity = await builder.acheck(history, sequence)
        assert fidelity.template_checked and fidelity.mismatches == 0
        on_loop = size <= chat.INLINE_RENDER_BYTES
        assert counting.threads and (counting.threads == {loop_thread}) is on_loop
        ids[on_loop] = delta
    assert ids[True] == ids[False]  # the same delta: only the question's length differs
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * chat.INLINE_RENDER_BYTES}}]
    counting = Counting(tok)
    builder = LocalPromptBuilder(counting, tools=tools)
    await builder.acheck(_question("hi"), await builder.afirst(_question("hi")))
    assert loop_thread not in counting.threads  # large tools count too


class Whole(Counting):
    """The real tokenizer, said to encode whole texts (as one ``segments`` refuses does)."""

    @property
    def encodes_from_cache(self):
        return False


async def _threads_of_delta_and_check(tokenizer: Counting, question: str) -> set[str]:
    builder = LocalPromptBuilder(tokenizer)
    history = _question(question)
    sequence = await builder.afirst(history)
    history = [*history, {"role": "assistant", "content": "24"}]
    sequence = sequence + tokenizer.tok.encode("24<|im_end|>")
    tokenizer.threads.clear()
    await builder.adelta(history, [{"role": "user", "content": "Sure?"}], sequence)
    fidelity = await builder.acheck(history, sequence)
    assert fidelity.template_checked and fidelity.mismatches == 0
    return tokenizer.threads


async def test_a_tokenizer_that_encodes_whole_texts_never_does_it_on_the_loop(tok):
    """Without cached pieces even a small conversation is tokenized whole (every Qwen
    tokenizer: segments refuses its normalizer): that work leaves the loop."""
    loop_thread = threading.current_thread().name
    assert await _threads_of_delta_and_check(Counting(tok), "What is 12 + 12?") == {loop_thread}
    threads = await _threads_of_delta_and_check(Whole(tok), "What is 12 + 12?")
    assert threads and loop_thread not in threads


async def test_the_inline_bound_counts_bytes_so_wide_characters_leave_the_loop(tok):
    """A character can be 4 bytes and ~4 ids: 600 of them are under the bound in
    characters but not in bytes, so their delta and check run on a thread."""
    loop_thread = threading.current_thread().name
    wide = "\U0001f600" * 600
    assert len(wide) < chat.INLINE_RENDER_BYTES < len(wide.encode("utf-8"))
    threads = await _threads_of_delta_and_check(Counting(tok), wide)
    assert threads and loop_thread not in threads
    assert await _threads_of_delta_and_check(Counting(tok), "a" * 600) == {loop_thread}


async def test_tools_whose_keys_differ_in_order_are_two_prompts_never_one(tok):
    """The template's ``tojson`` keeps key order, so the same schema written in another
    order renders another prompt: the cache must not serve one for the other."""
    counting = Counting(tok)

    def calc(properties: dict) -> list:
        return [
            {
                "type": "function",
                "function": {"name": "calc", "parameters": {"type": "object", "properties": properties}},
            }
        ]

    ab = calc({"a": {"type": "integer"}, "b": {"type": "string"}})
    ba = calc({"b": {"type": "string"}, "a": {"type": "integer"}})
    question = _question("What is 2 + 2?")
    first_ab = await LocalPromptBuilder(counting, tools=ab).afirst(question)
    first_ba = await LocalPromptBuilder(counting, tools=ba).afirst(question)
    assert first_ab == LocalPromptBuilder(tok, tools=ab).first(question)
    assert first_ba == LocalPromptBuilder(tok, tools=ba).first(question)
    assert counting.renders == 2  # (this template writes them alike; an HF one need not)


async def test_a_large_tool_list_is_not_kept(tok):
    """The key holds the tools: a harness's long tool list is rendered each time, so
    the cache's memory stays bounded by INLINE_CHARS per entry."""
    counting = Counting(tok)
    tools = [{"type": "function", "function": {"name": "calc", "description": "d" * chat.INLINE_CHARS}}]
    question = _question("What is 2 + 2?")
    first = await LocalPromptBuilder(counting, tools=tools).afirst(question)
    assert await LocalPromptBuilder(counting, tools=tools).afirst(question) == first and counting.renders == 2

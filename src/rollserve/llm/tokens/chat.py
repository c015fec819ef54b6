"""Append-only prompts: the next prompt is the previous prompt, the sampled ids, and
the tokens of the new messages only, rendered with the model's own chat template.

A token the policy sampled is never re-tokenized. The delta for new messages is the
difference between rendering the conversation with and without them. Where the
template would rewrite history (drop earlier reasoning, re-render a tool call), the
sequence stays append-only and the fidelity check reports the mismatch.

Two builders, one contract (the ``a``-prefixed async methods the agent loop calls):
``LocalPromptBuilder`` renders text with a local tokenizer (its sync methods do the work);
``BackendPromptBuilder`` gets ids from the serving backend's tokenizer
(``tokens.backend_tokenizer``, over HTTP). With ids the delta is ``ids(history + new,
generation prompt)`` minus ``ids(history)``, after the template's glue between the
sampled ids and the rendered history: when the render of the history starts with the
sampled sequence, the glue is the rest of it, in ids. When the sampled ids are not
how the template would tokenize them (a non-canonical split), the same comparison is
made on the detokenized text, as ``LocalPromptBuilder`` does; when the template rewrites
history, a stand-in conversation gives the delta (``fallback_deltas``).
Each tokenizer makes its own (``llm.base.Tokenizer.prompt_builder``).

``LocalPromptBuilder``'s async methods render and tokenize on a small pool of worker
threads (``RENDER_THREADS``), never on the event loop: a 1 MB prompt takes about a
second to tokenize and 10 MB ten, and the server must keep answering meanwhile (the
Rust tokenizer releases the GIL while it works). The opening prompt's ids are kept
per distinct conversation and tools (``FIRST_CACHE_BYTES`` of them in memory, least
recently used dropped first, each of at most ``INLINE_CHARS`` characters of text): the ``n`` samples
of a task render and tokenize it once, and the others find it on the loop, in
microseconds, without the hop to a thread and back. An opening prompt not found there
is rendered on the loop as well when it is small (``INLINE_RENDER_BYTES``, below). A turn's sampled ids (at most
``INLINE_DECODE_IDS``) are decoded on the loop too: microseconds, less than the hop.
So are the delta and the fidelity check of a conversation of at most
``INLINE_RENDER_BYTES`` bytes of UTF-8 text (with its tools), where the tokenizer
encodes from cached pieces (``tokens.segments``): the template renders it in tens of
microseconds, and only the text new to the tokenizer is tokenized, at most that many
bytes, so at most that many ids (a BPE token covers a byte or more): ~0.7 ms at the
~0.36 us an id measured for 4-byte characters (2,048 of them: 8,103 ids, 2.9 ms).
A tokenizer that encodes whole texts (``segments`` refuses it) tokenizes the whole
conversation every time: its deltas and checks always leave the loop.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import threading
import weakref
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rollserve.llm.base import Fidelity, Message, PromptOverBudget, ToolSchema
from rollserve.llm.tokens.base import IdTemplate, TextTemplate
from rollserve.llm.tokens.bytes_bound import min_tokens
from rollserve.llm.tokens.lru import SizedLRU, compact, id_bytes

__all__ = ["BackendPromptBuilder", "Fidelity", "LocalPromptBuilder", "off_loop"]

_PROBE = "\x00rollserve-probe\x00"

T = TypeVar("T")

RENDER_THREADS = max(2, min(8, os.cpu_count() or 2))
_render_pool = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="rollserve-render")


INLINE_CHARS = 4096  # an opening prompt of at most this much text is looked up on the loop
INLINE_DECODE_IDS = 1024  # sampled ids of at most this many are decoded on the loop
INLINE_RENDER_BYTES = 2048  # a conversation of at most this much UTF-8 text: its delta and check on the loop
FIRST_CACHE_BYTES = 16 << 20  # memory the opening prompts' keys and ids may hold per tokenizer


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a render thread; a cancelled caller stops waiting at once."""
    return await asyncio.get_running_loop().run_in_executor(_render_pool, fn, *args)


def _text_size(messages: list[Message]) -> int:
    """Characters of text in ``messages`` (content that is not text counts as large)."""
    size = 0
    for m in messages:
        content = m.get("content")
        size += len(content) if isinstance(content, str) else INLINE_CHARS + 1
        if "tool_calls" in m:
            size += INLINE_CHARS + 1  # (rendered from structure: not cheap to size)
    return size


def _utf8_size(conversation: tuple[list[Message], ...], limit: int) -> int:
    """Bytes of UTF-8 text in ``conversation`` (more than ``limit`` once past it: a
    string of n characters has n bytes or more, so a large one is never encoded)."""
    size = sum(_text_size(messages) for messages in conversation)
    if size > limit:
        return size
    return sum(len(str(m.get("content")).encode("utf-8")) for messages in conversation for m in messages)


# Opening prompts' ids by conversation, per tokenizer (shared by the render threads and the loop).
_first_caches: weakref.WeakKeyDictionary[Any, SizedLRU[str, array[int]]] = weakref.WeakKeyDictionary()
_first_caches_lock = threading.Lock()


def _first_cache(tok: TextTemplate) -> SizedLRU[str, array[int]] | None:
    try:
        with _first_caches_lock:
            cache = _first_caches.get(tok)
            if cache is None:
                cache = _first_caches[tok] = SizedLRU(FIRST_CACHE_BYTES, id_bytes)
            return cache
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        return None


class LocalPromptBuilder:
    """Builds the token prompts of one trajectory from text rendered here."""

    def __init__(self, tokenizer: TextTemplate, tools: list[ToolSchema] | None = None):
        self.tok = tokenizer
        self.tools = tools
        self.fidelity = Fidelity()
        self.max_prompt_tokens: int | None = None
        self._tools_key: str | None = None  # the tools' part of the opening-prompt key

    def _render(self, messages: list[Message], gen: bool) -> str:
        return self.tok.render(messages, add_generation_prompt=gen, tools=self.tools)

    def _encode(self, text: str, before: int = 0) -> list[int]:
        """Ids of ``text`` (to follow ``before`` ids); ``PromptOverBudget`` first when
        its bytes alone prove the prompt past ``max_prompt_tokens``: a text that large
        is never tokenized (a harness's megabytes would take a second and a gigabyte)."""
        limit, per_token = self.max_prompt_tokens, self.tok.max_token_bytes
        if limit is not None and per_token is not None and len(text) > (limit - before):
            size = len(text.encode("utf-8"))  # (a str of n characters has n bytes or more)
            at_least = before + min_tokens(size, per_token)
            if at_least > limit:
                raise PromptOverBudget(at_least, size, per_token)
        return self.tok.encode(text)

    def first(self, messages: list[Message]) -> list[int]:
        """Ids of the opening prompt (system/user messages + generation prompt); the
        same conversation with the same tools is rendered and tokenized once (a cached
        prompt past ``max_prompt_tokens`` takes the uncached path, which refuses it)."""
        return self._first(messages, self._first_key(messages))

    def _first(self, messages: list[Message], key: str | None) -> list[int]:
        cached = self._cached_first(key)
        if cached is not None:
            return cached
        ids = self._encode(self._render(messages, gen=True))
        cache = _first_cache(self.tok)
        if key is not None and cache is not None and _text_size(messages) <= INLINE_CHARS:
            cache.put(key, compact(ids))  # (only small prompts: the cache's memory stays bounded)
        return ids

    def _first_key(self, messages: list[Message]) -> str | None:
        """The conversation and tools as the template reads them: key order kept (the
        template's ``tojson`` keeps it, so two orders are two prompts); None (rendered
        every time) for content JSON cannot hold or tools over ``INLINE_CHARS``, so a
        key stays small and cheap to make on the loop."""
        try:
            if self._tools_key is None:
                self._tools_key = json.dumps(self.tools, ensure_ascii=False)
            if len(self._tools_key) > INLINE_CHARS:
                return None
            return json.dumps(messages, ensure_ascii=False) + "\n" + self._tools_key
        except (TypeError, ValueError):
            return None

    def _cached_first(self, key: str | None) -> list[int] | None:
        cache = _first_cache(self.tok)
        ids = None if key is None or cache is None else cache.get(key)
        if ids is None or (self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens):
            return None
        return ids.tolist()

    def assistant_content(self, output_ids: list[int], finish_reason: str) -> str:
        """The assistant message text for sampled ids (without the closing stop token)."""
        ids = output_ids
        if finish_reason == "stop" and ids and ids[-1] == self.tok.eos_token_id:
            ids = ids[:-1]
        return self.tok.decode(ids)

    def delta(self, history: list[Message], new: list[Message], sequence: list[int]) -> list[int]:
        """Ids to append after ``sequence`` (prompt + sampled ids so far) for ``new``.

        ``history`` is the conversation through the last assistant message.
        """
        rendered_history = self._render(history, gen=False)
        rendered_full = self._render(history + new, gen=True)
        sequence_text = self.tok.decode(sequence)
        if rendered_full.startswith(rendered_history) and rendered_history.startswith(sequence_text):
            # The template's glue after the sampled text (e.g. "\n" after <|im_end|>,
            # or "<|im_end|>\n" when the turn was cut by max_tokens), then the new
            # messages and the generation prompt.
            glue = rendered_history[len(sequence_text) :]
            return self._encode(glue + rendered_full[len(rendered_history) :], len(sequence))
        self.fidelity.fallback_deltas += 1
        return self._probe_delta(
            new, ended_with_eos=bool(sequence) and sequence[-1] == self.tok.eos_token_id, before=len(sequence)
        )

    def _probe_delta(self, new: list[Message], ended_with_eos: bool, before: int = 0) -> list[int]:
        """Delta from a stand-in conversation, for templates that rewrite history."""
        base: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
        rendered_base = self._render(base, gen=False)
        suffix = rendered_base[rendered_base.index(_PROBE) + len(_PROBE) :]
        eos_text = self.tok.decode([self.tok.eos_token_id])
        if ended_with_eos and suffix.startswith(eos_text):
            suffix = suffix[len(eos_text) :]
        rendered_full = self._render(base + new, gen=True)
        return self._encode(suffix + rendered_full[len(rendered_base) :], before)

    def check(self, messages: list[Message], sequence: list[int]) -> Fidelity:
        """Compare the append-only sequence with a full render of the conversation.

        ``mismatches`` counts the tokens of ``sequence`` that a re-render would not
        produce, aligned with a diff: a sampled, non-canonical split ("hel"+"lo"
        where the tokenizer writes "hello") counts its own tokens only, not every
        position after it. Tokens the template would add after the last turn (its
        closing glue) are not mismatches.
        """
        expected = self.tok.encode(self._render(messages, gen=False))
        return _record_check(self.fidelity, sequence, expected)

    # --- the contract the agent loop uses (the work runs on a render thread) ---------
    async def afirst(self, messages: list[Message]) -> list[int]:
        if _text_size(messages) <= INLINE_CHARS:  # (a small key: looked up here)
            key = self._first_key(messages)
            cached = self._cached_first(key)
            if cached is not None:
                return cached
            if self._small(messages):  # (rendered here too: cheaper than the hop)
                return self._first(messages, key)
        return await off_loop(self.first, messages)

    async def aassistant_content(self, output_ids: list[int], finish_reason: str) -> str:
        if len(output_ids) <= INLINE_DECODE_IDS:
            return self.assistant_content(output_ids, finish_reason)
        return await off_loop(self.assistant_content, output_ids, finish_reason)

    async def adelta(self, history: list[Message], new: list[Message], sequence: list[int]) -> list[int]:
        if self._small(history, new):
            return self.delta(history, new, sequence)
        return await off_loop(self.delta, list(history), list(new), list(sequence))

    async def acheck(self, messages: list[Message], sequence: list[int]) -> Fidelity:
        if self._small(messages):
            return self.check(messages, sequence)
        return await off_loop(self.check, list(messages), list(sequence))

    def _small(self, *conversation: list[Message]) -> bool:
        """Whether ``conversation`` (with the tools) is at most ``INLINE_RENDER_BYTES`` of
        UTF-8 text and the tokenizer encodes from cached pieces: rendered and tokenized
        on the loop in under a millisecond, less than the hop to a thread."""
        if not self.tok.encodes_from_cache:
            return False
        size = _utf8_size(conversation, INLINE_RENDER_BYTES)
        if size > INLINE_RENDER_BYTES:
            return False
        if self.tools is None:
            return True
        try:
            if self._tools_key is None:
                self._tools_key = json.dumps(self.tools, ensure_ascii=False)
        except (TypeError, ValueError):
            return False
        return size + len(self._tools_key.encode("utf-8")) <= INLINE_RENDER_BYTES


def _record_check(fidelity: Fidelity, sequence: list[int], expected: list[int]) -> Fidelity:
    """``check``'s comparison of ``sequence`` with the full render ``expected``."""
    first = next((i for i, (a, b) in enumerate(zip(sequence, expected)) if a != b), None)
    if first is None and len(sequence) > len(expected):
        first = len(expected)
    mismatches = 0
    if first is not None:  # diff only the differing tails (the common case is none)
        matcher = difflib.SequenceMatcher(a=sequence[first:], b=expected[first:], autojunk=False)
        matched = sum(block.size for block in matcher.get_matching_blocks())
        mismatches = len(sequence) - first - matched
    fidelity.template_checked = True
    fidelity.mismatches = mismatches
    fidelity.first_mismatch = first
    return fidelity


class BackendPromptBuilder:
    """``LocalPromptBuilder``'s prompts from a serving backend's tokenizer: ids, not text."""

    def __init__(self, tokenizer: IdTemplate, tools: list[ToolSchema] | None = None):
        self.tok = tokenizer
        self.tools = tools
        self.fidelity = Fidelity()
        self.max_prompt_tokens: int | None = None  # (the backend tokenizes: no bound here)

    async def _ids(self, messages: list[Message], gen: bool) -> list[int]:
        return await self.tok.render_ids(messages, add_generation_prompt=gen, tools=self.tools)

    async def afirst(self, messages: list[Message]) -> list[int]:
        await self.tok.ready()
        return await self._ids(messages, gen=True)

    async def aassistant_content(self, output_ids: list[int], finish_reason: str) -> str:
        await self.tok.ready()
        ids = output_ids
        if finish_reason == "stop" and ids and ids[-1] == self.tok.eos_token_id:
            ids = ids[:-1]
        return await self.tok.decode(ids)

    async def adelta(self, history: list[Message], new: list[Message], sequence: list[int]) -> list[int]:
        rendered_history = await self._ids(history, gen=False)
        rendered_full = await self._ids(history + new, gen=True)
        if rendered_full[: len(rendered_history)] == rendered_history and rendered_history[: len(sequence)] == sequence:
            # The template's glue after the sampled ids, then the new messages and the
            # generation prompt, as the template tokenizes them.
            return rendered_history[len(sequence) :] + rendered_full[len(rendered_history) :]
        history_text = await self.tok.decode(rendered_history)
        full_text = await self.tok.decode(rendered_full)
        sequence_text = await self.tok.decode(sequence)
        if full_text.startswith(history_text) and history_text.startswith(sequence_text):
            glue = history_text[len(sequence_text) :]
            return await self.tok.encode(glue + full_text[len(history_text) :])
        self.fidelity.fallback_deltas += 1
        await self.tok.ready()
        ended_with_eos = bool(sequence) and sequence[-1] == self.tok.eos_token_id
        return await self._probe_delta(new, ended_with_eos)

    async def _probe_delta(self, new: list[Message], ended_with_eos: bool) -> list[int]:
        """Delta from a stand-in conversation, for templates that rewrite history."""
        base: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
        rendered_base = await self.tok.decode(await self._ids(base, gen=False))
        suffix = rendered_base[rendered_base.index(_PROBE) + len(_PROBE) :]
        eos_text = await self.tok.decode([self.tok.eos_token_id])
        if ended_with_eos and suffix.startswith(eos_text):
            suffix = suffix[len(eos_text) :]
        rendered_full = await self.tok.decode(await self._ids(base + new, gen=True))
        return await self.tok.encode(suffix + rendered_full[len(rendered_base) :])

    async def acheck(self, messages: list[Message], sequence: list[int]) -> Fidelity:
        return _record_check(self.fidelity, sequence, await self._ids(messages, gen=False))

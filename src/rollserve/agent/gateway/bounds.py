"""What one gateway call may cost the server before the policy samples anything.

A harness's request is a body (read, then parsed), then a prompt (rendered, then
tokenized). A policy controls its harness's requests (through its tools it can send
its own), so each step is bounded before it is taken:

- ``max_body_bytes``: the largest body a session reads, from its context window. A
  prompt that fits ``T`` tokens is at most ``N * T`` bytes of text (``N``: the most
  bytes one token stands for, ``llm.tokens.bytes_bound``), and JSON spends at most 6
  bytes on a byte of text (``\\u001f``); ``BODY_SLACK`` covers the fields that are not
  rendered (model, sampling, ids). Never more than ``MAX_BODY`` (8 MiB, which holds a
  200k-token conversation several times over); ``MAX_BODY`` itself where ``N`` is
  unknown (a backend's tokenizer). A larger body is refused (``BodyTooLarge``) before it is read.
- the prompt: rendered, then refused as past the context window before it is
  tokenized when its bytes prove it (``PromptOverBudget``); only a prompt that may
  fit is tokenized.
- ``MAX_WAITING_CALLS``: calls of one session admitted at once (reading, parsing, or
  waiting for their turn): so one session holds at most that many bodies.
- ``COUNTS_PER_TURN``: Anthropic's ``count_tokens`` (a whole render and tokenize,
  nothing sampled) answered per turn of the session's ``max_turns``; past it, a 400.
- ``INLINE_BYTES``: a request (or answer) up to this size is parsed, converted and
  rendered on the event loop (``sized``), where it takes a fraction of a millisecond,
  less than a hand-off to a worker thread and back; a larger one on a worker thread,
  so that no conversation, however large, stalls the loop that serves every rollout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "BODY_SLACK",
    "COUNTS_PER_TURN",
    "INLINE_BYTES",
    "JSON_BYTES_PER_BYTE",
    "MAX_BODY",
    "MAX_WAITING_CALLS",
    "max_body_bytes",
    "sized",
]

T = TypeVar("T")

MAX_BODY = 8 * 1024 * 1024
JSON_BYTES_PER_BYTE = 6
BODY_SLACK = 256 * 1024
# A harness makes one call at a time; a policy flooding the gateway from its tools
# cannot queue requests (and their bodies) without bound: past this, ``TooManyCalls``.
MAX_WAITING_CALLS = 4
COUNTS_PER_TURN = 4
INLINE_BYTES = 16 * 1024


def max_body_bytes(context_tokens: int, token_bytes: int | None) -> int:
    """The largest request body for a context window of ``context_tokens`` tokens of at
    most ``token_bytes`` bytes each (None: unknown)."""
    if token_bytes is None:
        return MAX_BODY
    return min(MAX_BODY, JSON_BYTES_PER_BYTE * token_bytes * context_tokens + BODY_SLACK)


async def sized(size: int | None, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, whose work grows with a request of ``size`` bytes (None: unknown):
    on the event loop up to ``INLINE_BYTES``, else on a worker thread."""
    if size is not None and size <= INLINE_BYTES:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)

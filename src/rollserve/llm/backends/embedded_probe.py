"""Whether llama.cpp's batched kernels give the same bits however a sequence is split
into batches (on some CPUs, e.g. with AVX-512/AMX, the kernel depends on the batch
size). The embedded backend reuses its KV cache freely only where they do."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The probe's splits of one sequence: all in one batch, and in batches of many small
#: sizes, each with the cache holding the batches before it (as a reused prefix would).
PROBE_WHOLE: tuple[int, ...] = (70,)
PROBE_SPLIT: tuple[int, ...] = (2, 3, 4, 5, 8, 16, 17, 15)
PROBE_TEXT = (
    "<|im_start|>system\nYou are a careful assistant. Think step by step, use the tools "
    "you are given, and end with the answer in \\boxed{}.<|im_end|>\n<|im_start|>user\n"
    "A train leaves at 09:40 and arrives at 13:05. How many minutes is the trip? Then list "
    "the files in /tmp with `ls -la /tmp`.<|im_end|>\n<|im_start|>assistant\n"
    "From 09:40 to 13:05 is 3 hours and 25 minutes, that is 205 minutes: \\boxed{205}."
)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: whether both splits left the same bits (the last
    position's logits and the KV cache), and how long it took (seconds)."""

    invariant: bool
    seconds: float


def probe_batch_invariance(
    llm: Any,
    whole: tuple[int, ...] = PROBE_WHOLE,
    split: tuple[int, ...] = PROBE_SPLIT,
    tokens: list[int] | None = None,
) -> ProbeResult:
    """Evaluate one token sequence twice from an empty cache, batched as ``whole`` and
    as ``split`` (each batch on top of the cache the earlier ones left), and say whether
    both left the same bits: the last position's logits and the whole KV cache (every
    layer's keys and values at every position). Leaves the cache empty.

    ``tokens``: the sequence (default: the start of a ChatML exchange, ordinary text
    being what the kernels will see; on random ids the one-row and batched paths can
    happen to agree where on text they do not)."""
    import llama_cpp

    count = sum(whole)
    if sum(split) != count:
        raise ValueError(f"split: must cover as many tokens as whole ({count})")
    if tokens is None:
        tokens = llm.tokenize(PROBE_TEXT.encode(), add_bos=False, special=True)
    if len(tokens) < count:
        raise ValueError(f"tokens: {len(tokens)} tokens, the batches need {count}")
    vocab = llm.n_vocab()
    started = time.perf_counter()
    seen: list[tuple[np.ndarray, bytes]] = []
    try:
        for batches in (whole, split):
            llm.reset()
            done = 0
            for size in batches:
                llm.eval(tokens[done : done + size])
                done += size
            logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            nbytes = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
            state = (ctypes.c_uint8 * nbytes)()
            got = llama_cpp.llama_state_seq_get_data(llm.ctx, state, nbytes, 0)
            seen.append((np.ctypeslib.as_array(logits, shape=(vocab,)).copy(), bytes(state[:got])))
    finally:
        llm.reset()
    (logits_a, cache_a), (logits_b, cache_b) = seen
    same = bool(np.array_equal(logits_a, logits_b)) and cache_a == cache_b
    return ProbeResult(same, time.perf_counter() - started)

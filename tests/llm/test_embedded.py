"""The embedded SmolLM2 model (llama.cpp, in-process): exact, deterministic, cancellable."""

import asyncio
import time

import pytest

pytest.importorskip("llama_cpp", reason="the embedded model needs extra 'local' (llama-cpp-python)")

from rollserve.llm.backends.embedded import BLOCK, EmbeddedBackend
from rollserve.llm.backends.embedded_probe import PROBE_WHOLE, probe_batch_invariance
from rollserve.llm.base import LLMBackend, SamplingParams
from rollserve.llm.tokens.tokenizer import smollm2_gguf_path

pytestmark = pytest.mark.embedded

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def backend():
    return EmbeddedBackend(n_ctx=1024, n_threads=2)


async def test_greedy_is_deterministic_with_valid_logprobs(backend, chat_prompt):
    assert isinstance(backend, LLMBackend)
    prompt = chat_prompt("What is the capital of France?")
    first = await backend.generate(prompt, GREEDY)
    second = await backend.generate(prompt, GREEDY)  # its prompt is in the KV cache now
    assert first.output_ids == second.output_ids
    # The same computation both times (see test_results_do_not_depend_on_earlier_calls).
    assert first.logprobs == second.logprobs
    assert all(lp <= 0 for lp in first.logprobs)
    assert len(first.output_ids) == len(first.logprobs) > 0
    assert first.finish_reason in ("stop", "length") and first.backend == "embedded"
    if first.finish_reason == "stop":
        assert first.output_ids[-1] == 2  # <|im_end|>, included like vLLM


async def test_results_do_not_depend_on_earlier_calls(backend, chat_prompt, tok):
    """A call's ids and logprobs are a function of its prompt and sampling only: the KV
    cache is reused just where it holds what a fresh evaluation computes. (llama.cpp's
    single-token path rounds apart from its batched one by up to ~0.5 in a logprob on
    this Q4_1 model, so a naive cache made results depend on what ran before.)"""
    fresh = EmbeddedBackend(n_ctx=1024, n_threads=2)
    try:
        a = chat_prompt("Name a colour.")
        b = chat_prompt("Count to five.")
        first_turn = await backend.generate(a, GREEDY)
        # Turn two extends turn one: in the cache, turn one's sampled tokens were
        # evaluated one at a time; a fresh backend evaluates them in one batch.
        glue = [] if first_turn.finish_reason == "stop" else tok.encode("<|im_end|>")
        turn_two = (
            a
            + first_turn.output_ids
            + glue
            + tok.encode("\n")
            + tok.encode("<|im_start|>user\nAnother.<|im_end|>\n<|im_start|>assistant\n")
        )
        warm = await backend.generate(turn_two, GREEDY)
        await backend.generate(b, GREEDY)  # another rollout's call in between
        again = await backend.generate(a, GREEDY)
        # 513 = one full llama.cpp batch + 1: the remainder must not be a batch of one.
        long = (a * 40)[:513]
        short = SamplingParams(temperature=0.0, max_tokens=4)
        warm_long = await backend.generate(long, short)
        for prompt, sampling, seen in (
            (turn_two, GREEDY, warm),
            (a, GREEDY, first_turn),
            (a, GREEDY, again),
            (long, short, warm_long),
        ):
            cold = await fresh.generate(prompt, sampling)
            assert (cold.output_ids, cold.logprobs) == (seen.output_ids, seen.logprobs)
    finally:
        await fresh.close()


async def test_the_load_probe_chooses_the_cache_mode(backend, chat_prompt):
    """At load a probe evaluates one sequence whole and split into small batches; the
    cache prefix is reused only where both give the same bits (on AVX-512/AMX CPUs the
    kernels may depend on the batch size). Its verdict and time are in describe()."""
    prompt = chat_prompt("Name a fruit.")
    await backend.generate(prompt, GREEDY)
    info = backend.describe()
    probe = info["cache_probe"]
    assert probe is not None and probe["seconds"] > 0
    assert info["cache_mode"] == ("prefix" if probe["batch_invariant"] else "blocks")
    before = info["prompt_tokens_reused"]
    await backend.generate(prompt, GREEDY)
    reused = backend.describe()["prompt_tokens_reused"] - before
    # "prefix" re-evaluates just the last two prompt tokens; "blocks" all but whole blocks.
    blocks = (len(prompt) - 2) // BLOCK * BLOCK
    assert reused == (len(prompt) - 2 if info["cache_mode"] == "prefix" else blocks)


def test_the_probe_sees_a_real_rounding_difference():
    """The probe compares bits: a split ending in a one-token batch (llama.cpp's
    single-row path, which on these tokens rounds apart from its batched one) is
    reported as not invariant, and the cache is left empty."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(str(smollm2_gguf_path()), n_ctx=256, n_threads=2, verbose=False)
    try:
        vocab, tokens = llm.n_vocab(), list(range(1000, 1070))
        last = []
        for batches in ((70,), (69, 1)):  # computed here, independently of the probe
            llm.reset()
            for start, size in zip((0, batches[0]), batches, strict=False):
                llm.eval(tokens[start : start + size])
            raw = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            last.append(np.ctypeslib.as_array(raw, shape=(vocab,)).copy())
        if np.array_equal(*last):
            pytest.skip("this CPU's one-row path rounds like its batched one on these tokens")
        assert not probe_batch_invariance(llm, PROBE_WHOLE, (69, 1), tokens).invariant
        assert llm.n_tokens == 0
        with pytest.raises(ValueError, match="split"):
            probe_batch_invariance(llm, PROBE_WHOLE, (2, 3))
        with pytest.raises(ValueError, match="tokens"):
            probe_batch_invariance(llm, tokens=tokens[:10])
    finally:
        llm.close()


async def test_blocks_mode_by_option_is_exact(chat_prompt, tok):
    """cache="blocks" (what a CPU whose probe fails gets): prompts are evaluated in
    fixed blocks from position 0 and only whole blocks are reused, and a call's ids and
    logprobs are the same whatever the backend ran before."""
    blocky = EmbeddedBackend(n_ctx=1024, n_threads=2, cache="blocks")
    fresh = EmbeddedBackend(n_ctx=1024, n_threads=2, cache="blocks")
    try:
        # Longer than two blocks, and not ending just past a block's end (see batch_chunks).
        a = next(
            p
            for n in range(12, 40)
            if (p := chat_prompt("Name an animal. " * n)) and len(p) > 2 * BLOCK and len(p) % BLOCK >= 2
        )
        first = await blocky.generate(a, GREEDY)
        glue = [] if first.finish_reason == "stop" else tok.encode("<|im_end|>")
        turn_two = (
            a
            + first.output_ids
            + glue
            + tok.encode("\n")
            + tok.encode("<|im_start|>user\nAnother.<|im_end|>\n<|im_start|>assistant\n")
        )
        second = await blocky.generate(turn_two, GREEDY)  # extends what the cache holds
        again = await blocky.generate(a, GREEDY)
        info = blocky.describe()
        assert (info["cache_mode"], info["cache_probe"]) == ("blocks", None)
        assert info["prompt_tokens"] == 2 * len(a) + len(turn_two)
        # Turn two reuses turn one's whole blocks (its sampled tokens were evaluated one
        # at a time: not reused); the repeat reuses them again.
        assert info["prompt_tokens_reused"] == 2 * (len(a) // BLOCK * BLOCK) > 0
        assert (again.output_ids, again.logprobs) == (first.output_ids, first.logprobs)
        # Another backend in this mode, with another history, computes the same bits
        # (the same code path: equality across modes is only what the load probe checks).
        await fresh.generate(chat_prompt("Count to three."), GREEDY)
        for prompt, seen in ((turn_two, second), (a, first)):
            other = await fresh.generate(prompt, GREEDY)
            assert (other.output_ids, other.logprobs) == (seen.output_ids, seen.logprobs)
    finally:
        await blocky.close()
        await fresh.close()


async def test_seeded_sampling_repeats_and_limits_hold(backend, chat_prompt):
    prompt = chat_prompt("Tell me a word.")
    sampling = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=11, max_tokens=6)
    a = await backend.generate(prompt, sampling)
    b = await backend.generate(prompt, sampling)
    assert a.output_ids == b.output_ids
    assert len(a.output_ids) <= 6
    stop_at = a.output_ids[1] if len(a.output_ids) > 1 else a.output_ids[0]
    cut = await backend.generate(prompt, sampling.model_copy(update={"stop_token_ids": [stop_at]}))
    assert cut.finish_reason == "stop" and cut.output_ids[-1] == stop_at


async def test_multi_turn_prompt_reuses_the_cache(backend, chat_prompt, tok):
    prompt = chat_prompt("Say hi.")
    first = await backend.generate(prompt, GREEDY)
    follow = tok.encode("<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n")
    glue = [] if first.finish_reason == "stop" else tok.encode("<|im_end|>")
    second = await backend.generate(prompt + first.output_ids + glue + tok.encode("\n") + follow, GREEDY)
    assert second.output_ids and all(lp <= 0 for lp in second.logprobs)


async def test_cancel_stops_within_a_token_and_the_loop_stays_free(backend, chat_prompt):
    prompt = chat_prompt("Write a very long story about a dragon.")
    long = SamplingParams(temperature=0.0, max_tokens=900)  # ~10 s if it ran to the end
    task = asyncio.create_task(backend.generate(prompt, long))
    worst_lag = 0.0
    for _ in range(20):  # the event loop keeps ticking while the model works
        before = time.perf_counter()
        await asyncio.sleep(0.01)  # sleep-ok: measures the loop's lag while the model works
        worst_lag = max(worst_lag, time.perf_counter() - before - 0.01)
    assert not task.done()
    assert worst_lag < 0.5  # a blocked loop would lag by the whole generation
    cancelled_at = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # One token is ~15 ms on 2 idle cores; the margin is for a busy machine.
    assert time.perf_counter() - cancelled_at < 5.0
    assert backend.outstanding == 0
    # The model is free again at once.
    started = time.perf_counter()
    assert (await backend.generate(prompt, SamplingParams(temperature=0, max_tokens=2))).output_ids
    assert time.perf_counter() - started < 10


def test_gguf_tokenizer_agrees_with_chat_tokenizer(tok):
    import llama_cpp

    vocab = llama_cpp.Llama(str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    conversations = [
        [{"role": "user", "content": "What is 123 + 4567? Answer with digits only."}],
        [
            {"role": "system", "content": "You solve tasks.\tUse tools."},
            {"role": "user", "content": "Liste les fichiers: `ls -la /tmp` — merci! 😀"},
            {"role": "assistant", "content": "```bash\nls -la /tmp\n```"},
            {"role": "user", "content": "total 0\ndrwxrwxrwt  2 root root  40 Jan  1 00:00 .\n"},
        ],
    ]
    for messages in conversations:
        text = tok.render(messages, add_generation_prompt=True)
        assert tok.encode(text) == vocab.tokenize(text.encode(), add_bos=False, special=True)
    assert vocab.token_eos() == tok.eos_token_id


async def test_errors_are_typed(backend):
    from rollserve.errors import ContextWindowError, LLMError

    # over n_ctx: refused unsent, as a server's window refuses it (the loop's
    # context_exhausted, a judge's refusal)
    with pytest.raises(ContextWindowError, match="context"):
        await backend.generate([1] * 2000, GREEDY)
    with pytest.raises(LLMError, match="outside"):
        await backend.generate([10**6], GREEDY)
    assert await backend.health()
    assert backend.describe()["kind"] == "embedded"

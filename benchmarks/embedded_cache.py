"""Embedded model: a multi-turn episode with the KV cache reused vs evaluated afresh.

One agent episode of ``--turns`` turns on the embedded SmolLM2 model (greedy, at most
``--max-tokens`` tokens a turn); after each reply a fixed tool observation and user
message are appended, and the next call's prompt is the whole conversation so far.
The same episode runs on a backend in ``"prefix"`` mode (what a CPU whose batched
kernels pass the load-time probe gets: the cached prefix is reused) and in
``"blocks"`` mode (``cache="blocks"``, what a CPU that fails the probe gets: prompts
evaluated in 64-token blocks from position 0, only whole blocks reused), alternately,
``--rounds`` times each. Reports the median wall time of the episode, the prompt
tokens evaluated and reused, the probe's time at load, and checks that both modes produced the same ids and logprobs.

    python -m benchmarks.embedded_cache [--turns 20] [--max-tokens 24] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks.common import median, report
from rollserve.llm.backends.embedded import EmbeddedBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.tokens.tokenizer import ChatTokenizer

OBSERVATION = ("<|im_start|>user\nTool output:\ntotal 8\n-rw-r--r-- 1 root root 120 notes.txt\n"
               "-rw-r--r-- 1 root root 64 answer.txt\nContinue.<|im_end|>\n"
               "<|im_start|>assistant\n")


async def episode(backend: EmbeddedBackend, tok: ChatTokenizer, turns: int,
                  max_tokens: int) -> tuple[float, list[tuple[list[int], list[float]]]]:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompt = tok.encode(tok.render(
        [{"role": "system", "content": "You are an agent. Use the shell to solve tasks."},
         {"role": "user", "content": "Find the answer file in this folder and read it."}],
        add_generation_prompt=True))
    outputs = []
    started = time.perf_counter()
    for _ in range(turns):
        out = await backend.generate(prompt, sampling)
        outputs.append((out.output_ids, out.logprobs))
        glue = [] if out.finish_reason == "stop" else tok.encode("<|im_end|>")
        prompt = prompt + out.output_ids + glue + tok.encode("\n" + OBSERVATION)
    return time.perf_counter() - started, outputs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tok = ChatTokenizer.load("smollm2")
    backends = {
        "prefix": EmbeddedBackend(n_ctx=4096, n_threads=args.threads),
        "blocks": EmbeddedBackend(n_ctx=4096, n_threads=args.threads, cache="blocks"),
    }
    for backend in backends.values():  # load (and probe) before timing anything
        await backend.generate(tok.encode("Hi"), SamplingParams(temperature=0.0, max_tokens=1))
    before = {mode: (b.prompt_tokens, b.prompt_tokens_reused) for mode, b in backends.items()}
    times: dict[str, list[float]] = {mode: [] for mode in backends}
    outputs: dict[str, list] = {}
    for _ in range(args.rounds):
        for mode, backend in backends.items():
            seconds, outputs[mode] = await episode(backend, tok, args.turns, args.max_tokens)
            times[mode].append(seconds)
    rows = []
    for mode, backend in backends.items():
        info = backend.describe()
        if info["cache_mode"] != mode:
            raise RuntimeError(f"{mode}: the backend chose {info['cache_mode']!r} (probe failed?)")
        probe = info["cache_probe"]
        evaluated, reused = (info["prompt_tokens"] - before[mode][0],
                             info["prompt_tokens_reused"] - before[mode][1])
        rows.append([mode, args.turns, median(times[mode]), evaluated // args.rounds,
                     reused // args.rounds,
                     "-" if probe is None else probe["seconds"]])
        await backend.close()
    same = outputs["prefix"] == outputs["blocks"]
    report("embedded_cache", f"{args.turns}-turn episode, embedded SmolLM2 (same ids and "
           f"logprobs in both modes: {same})",
           ["mode", "turns", "episode s (median)", "prompt tokens", "reused", "probe s"], rows,
           {"config": vars(args), "times": times, "same_outputs": same})
    if not same:
        raise SystemExit("the two modes produced different ids or logprobs")


if __name__ == "__main__":
    asyncio.run(main())

"""10,000 LLM calls in flight at once through the router, to a test double in its own
process: do they all complete, and what does the client pay per call?

The double (``FakeVLLM``, unlimited slots) holds every call for ``--latency`` s, long
enough for the whole burst to be in flight together. Each call is its own
trajectory (a router session). Reports the peak number in flight, failures, wall
time, the client's CPU seconds per call and its memory (peak RSS, and the growth
over the idle process).

    python -m benchmarks.client_scale [--calls 10000] [--latency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import time

import psutil

from benchmarks.common import report
from benchmarks.fake_fleet import FakeFleet
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.llm.tokens.tokenizer import ChatTokenizer


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def burst(url: str, calls: int, expected: list[int]) -> dict:
    proc = psutil.Process()
    router = Router(policy_version=1)
    router.add(VLLMBackend(url, name="double", model="fake-model"))
    prompt = [1, 9690, 198, 2683, 359, 253, 5649, 4119, 11173, 30, 2, 198, 1, 4093, 198]
    sampling = SamplingParams(max_tokens=16)
    await router.session("warm-up").generate(prompt, sampling)  # model name, one connection
    gc.collect()
    rss_before = proc.memory_info().rss
    peak = {"in_flight": 0, "rss": rss_before}

    async def watch() -> None:
        while True:
            peak["in_flight"] = max(peak["in_flight"], router.in_flight)
            peak["rss"] = max(peak["rss"], proc.memory_info().rss)
            await asyncio.sleep(0.05)

    async def one(i: int) -> bool:
        gen = await router.session(f"c{i}").generate(prompt, sampling)
        return gen.output_ids == expected and len(gen.logprobs) == len(expected)

    watcher = asyncio.create_task(watch())
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    outcomes = await asyncio.gather(*[one(i) for i in range(calls)], return_exceptions=True)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    watcher.cancel()
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    await router.stop()
    return {
        "calls": calls,
        "completed": sum(o is True for o in outcomes),
        "wrong_tokens": sum(o is False for o in outcomes),
        "errors": len(errors),
        "first_error": repr(errors[0]) if errors else None,
        "peak_in_flight": peak["in_flight"],
        "wall_s": wall,
        "client_cpu_s": cpu,
        "cpu_ms_per_call": 1000 * cpu / calls,
        "rss_idle_mb": rss_before / 2**20,
        "rss_peak_mb": peak["rss"] / 2**20,
        "rss_growth_kb_per_call": (peak["rss"] - rss_before) / 1024 / calls,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "retries": router.counters["retries"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=8.0, help="seconds the double holds a call")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.calls + 1000:  # one socket per call in flight
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.calls + 1000), hard))
    tok = ChatTokenizer.load("smollm2")
    expected = tok.encode("ok") + [tok.eos_token_id]
    with FakeFleet([{"latency": args.latency, "replies": ["ok"]}]) as fleet:
        result = asyncio.run(burst(fleet.urls[0], args.calls, expected))
    rows = [[result["calls"], result["completed"], result["errors"], result["peak_in_flight"],
             round(result["wall_s"], 2), round(result["cpu_ms_per_call"], 3),
             round(result["rss_peak_mb"], 1), round(result["rss_growth_kb_per_call"], 1)]]
    report("client_scale",
           f"{args.calls} concurrent calls through the router (double holds each {args.latency:g}s)",
           ["calls", "completed", "errors", "peak in flight", "wall s", "client CPU ms/call",
            "peak RSS MB", "RSS KB/call"],
           rows, {"config": vars(args), "result": result})
    if result["completed"] != args.calls:
        raise SystemExit(f"only {result['completed']} of {args.calls} completed: {result['first_error']}")


if __name__ == "__main__":
    main()

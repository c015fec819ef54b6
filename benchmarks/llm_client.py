"""The LLM client's CPU per call: ``HTTPClient.request_json`` over aiohttp (the old
path, still used for https) against the same call over ``llm.backends.http1`` (kept-alive
HTTP/1.1, answers parsed by httptools), side by side in one process on uvloop (the
server's loop), alternated for ``--rounds`` rounds.

Each round sends ``--calls`` vLLM completions requests (a 90-id prompt; the test
double's answer carries ids and logprobs, as in ``benchmarks.concurrency``), at most
``--concurrency`` at once, to a test double in its own process answering at once; the
CPU is this process's own (``time.process_time``) over the round, divided by the calls.
Both paths must return the same answers (but for each answer's id and time).

    python -m benchmarks.llm_client [--calls 3000] [--concurrency 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import uvloop

from benchmarks.common import fake_llm, free_port, report, wait_http
from rollserve.llm.backends import http as http_module
from rollserve.llm.backends.http import HTTPClient

BODY = {"model": "fake-model", "prompt": list(range(1, 91)), "max_tokens": 32, "temperature": 1.0, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False}


def client(url: str, lean: bool) -> HTTPClient:
    """An ``HTTPClient``; ``lean=False``: the aiohttp path (as for an https server)."""
    made = HTTPClient(url, "lean" if lean else "aiohttp")
    made._lean = lean  # (the path's choice, made from the URL at construction)
    return made


async def cpu_per_call(one: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> tuple[float, object]:
    gate = asyncio.Semaphore(concurrency)

    async def call() -> object:
        async with gate:
            return await one()

    await asyncio.gather(*(call() for _ in range(concurrency)))  # connections opened, warm
    started = time.process_time()
    answers = await asyncio.gather(*(call() for _ in range(calls)))
    return 1e6 * (time.process_time() - started) / calls, answers[0]


def _same(answer: object) -> object:
    """An answer without what differs per call (its id and time)."""
    return {k: v for k, v in answer.items() if k not in ("id", "created")} if isinstance(answer, dict) else answer


async def measure(url: str, calls: int, concurrency: int, rounds: int) -> dict[str, list[float]]:
    paths = {"aiohttp": client(url, lean=False), "http1": client(url, lean=True)}
    per_call: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for r in range(rounds):
            answers = {}
            for name in (["aiohttp", "http1"] if r % 2 == 0 else ["http1", "aiohttp"]):
                c = paths[name]
                cpu, answers[name] = await cpu_per_call(lambda c=c: c.request_json("POST", "/v1/completions", BODY),
                                                        calls, concurrency)
                per_call[name].append(cpu)
            if _same(answers["aiohttp"]) != _same(answers["http1"]):
                raise SystemExit("the two paths returned different answers")
    finally:
        for c in paths.values():
            await c.close()
    return per_call


def main(calls: int, concurrency: int, rounds: int) -> None:
    port = free_port()
    fake = fake_llm(port, 0.0, "Let me think about it.")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", fake)
        per_call = uvloop.run(measure(f"http://127.0.0.1:{port}", calls, concurrency, rounds))
    finally:
        fake.terminate()
        fake.wait(timeout=60)
    rows = [[name, *(round(v, 1) for v in values), round(statistics.median(values), 1)]
            for name, values in per_call.items()]
    report("llm_client", f"LLM client CPU per call (us), {calls} calls x {rounds} rounds, {concurrency} at once",
           ["path", *(f"round {i + 1}" for i in range(rounds)), "median"], rows,
           {"config": {"calls": calls, "concurrency": concurrency, "rounds": rounds, "prompt_ids": len(BODY["prompt"]),
                       "client_module": http_module.__name__},
            "results": {name: {"us_per_call": values, "median_us_per_call": statistics.median(values)}
                        for name, values in per_call.items()}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.calls, args.concurrency, args.rounds)

"""The LLM client's CPU per call: ``HTTPClient.request_json`` as main's tree configures
aiohttp (``--before``, a ``src`` directory, e.g. ``git archive main src | tar -x -C
/tmp/old``) against the same call as this tree configures it, alternated for
``--rounds`` rounds. Each round of each client runs in a process of its own on uvloop
(the server's loop) with that tree first on its path, so each client is its whole tree's.

Each round sends ``--calls`` vLLM completions requests (a 90-id prompt; the test
double's answer carries ids and logprobs, as in ``benchmarks.concurrency``), at most
``--concurrency`` at once, to a test double in its own process answering at once; the
CPU is that process's own (``time.process_time``) over the round, divided by the calls.
Both clients must return the same answers (but for each answer's id and time).

    python -m benchmarks.llm_client --before /tmp/old/src [--calls 3000] [--concurrency 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from benchmarks.common import fake_llm, free_port, report, wait_http

BODY = {"model": "fake-model", "prompt": list(range(1, 91)), "max_tokens": 32, "temperature": 1.0, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False}
ROOT = Path(__file__).resolve().parent.parent
BEFORE, AFTER = "aiohttp as main uses it", "aiohttp as this tree uses it"


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


async def one_round(url: str, calls: int, concurrency: int) -> dict:
    """One client's round, in this process (``--arm``): its CPU per call and first answer."""
    from rollserve.llm.backends.http import HTTPClient  # the tree first on this process's path

    c = HTTPClient(url, "bench")
    try:
        cpu, answer = await cpu_per_call(lambda: c.request_json("POST", "/v1/completions", BODY), calls, concurrency)
    finally:
        await c.close()
    return {"us_per_call": cpu, "answer": _same(answer)}


def run_arm(src: Path, url: str, calls: int, concurrency: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src.resolve()), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "benchmarks.llm_client", "--arm", url, "--calls", str(calls),
                           "--concurrency", str(concurrency)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the client from {src} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(before_src: Path, calls: int, concurrency: int, rounds: int) -> None:
    trees = {BEFORE: before_src, AFTER: ROOT / "src"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fake = fake_llm(port, 0.0, "Let me think about it.")
    per_call: dict[str, list[float]] = {name: [] for name in trees}
    try:
        wait_http(f"{url}/health", fake)
        for r in range(rounds):
            answers = {}
            for name in ([BEFORE, AFTER] if r % 2 == 0 else [AFTER, BEFORE]):
                got = run_arm(trees[name], url, calls, concurrency)
                per_call[name].append(got["us_per_call"])
                answers[name] = got["answer"]
            if answers[BEFORE] != answers[AFTER]:
                raise SystemExit("the two clients returned different answers")
    finally:
        fake.terminate()
        fake.wait(timeout=60)
    rows = [[name, *(round(v, 1) for v in values), round(statistics.median(values), 1)]
            for name, values in per_call.items()]
    report("llm_client", f"LLM client CPU per call (us), {calls} calls x {rounds} rounds, {concurrency} at once",
           ["client", *(f"round {i + 1}" for i in range(rounds)), "median"], rows,
           {"config": {"calls": calls, "concurrency": concurrency, "rounds": rounds, "prompt_ids": len(BODY["prompt"]),
                       "before": str(before_src), "after": "this tree's src"},
            "results": {name: {"us_per_call": values, "median_us_per_call": statistics.median(values)}
                        for name, values in per_call.items()}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--before", type=Path, help="a src directory with main's rollserve")
    parser.add_argument("--arm", metavar="URL", help=argparse.SUPPRESS)  # one client's round, in a child
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(uvloop.run(one_round(args.arm, args.calls, args.concurrency))))
    elif args.before is None:
        parser.error("--before is required")
    else:
        main(args.before, args.calls, args.concurrency, args.rounds)

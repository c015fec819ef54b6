"""Sandbox acquisition with the warm pool vs without, in one run, per runtime here.

What a rollout's INIT waits for is the server runtime's ``start(spec)`` (a spec with
a workspace file, as the code handler's); then, as the bash tool does first, a shell
on a PTY and its prompt; then the rollout closes the sandbox. Two ways, side by side:

- cold: ``LazyRuntime(pool=0)``: every start is a fresh ``Runtime.start``;
- pooled: ``LazyRuntime(pool=N)``: a first burst of acquisitions teaches the pool
  the demand; each measured round then waits (not timed) until the pool is refilled
  and times the acquisition.

Rounds are sequential (``--rounds``), then bursts: ``--burst`` acquisitions at once,
the pool sized to the burst, between bursts a refill (not timed). Reports p50/p95 of
the acquisition and of the whole acquire -> prompt -> close round. Targets:
acquisition p50 <= 2 ms pooled; cold start -> prompt -> close p50 <= 20 ms (idle).

    python -m benchmarks.sandbox_pool [--rounds 100] [--burst 8] [--runtimes bubblewrap,local]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from benchmarks.common import median, percentile, report
from benchmarks.sandbox_start import open_shell, wait_prompt
from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.registry import LazyRuntime, availability

SPEC = SandboxSpec(files={"solution.py": "a, b = map(int, input().split())\nprint(a + b)\n"})


async def prompt_and_close(sandbox) -> None:
    await wait_prompt(await open_shell(sandbox))
    await sandbox.close()


async def one_round(lazy: LazyRuntime) -> tuple[float, float]:
    """(acquisition s, acquire -> prompt -> close s)."""
    started = time.perf_counter()
    sandbox = await lazy.start(SPEC)
    acquired = time.perf_counter()
    await prompt_and_close(sandbox)
    return acquired - started, time.perf_counter() - started


async def refilled(lazy: LazyRuntime, count: int) -> None:
    """Wait (bounded) until the pool holds ``count`` ready sandboxes."""
    assert lazy.pool is not None
    deadline = time.monotonic() + 60
    while len(lazy.pool.ready()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool not refilled to {count}: {lazy.pool.status()}")
        await asyncio.sleep(0.005)


async def burst(lazy: LazyRuntime, size: int) -> list[tuple[float, float]]:
    return list(await asyncio.gather(*(one_round(lazy) for _ in range(size))))


def summary(rounds: list[tuple[float, float]]) -> dict:
    acquire = [r[0] for r in rounds]
    total = [r[1] for r in rounds]
    return {"n": len(rounds),
            "acquire_p50_ms": 1000 * median(acquire), "acquire_p95_ms": 1000 * percentile(acquire, 95),
            "round_p50_ms": 1000 * median(total), "round_p95_ms": 1000 * percentile(total, 95)}


async def measure(name: str, rounds: int, size: int, state_dir: str) -> list[dict]:
    out = []
    for pooled in (False, True):
        lazy = LazyRuntime(name, state_dir, pool=size if pooled else 0)
        try:
            await one_round(lazy)  # warm-up: the runtime made, page cache, imports
            if pooled:
                await burst(lazy, size)  # the demand the pool learns
                await refilled(lazy, size)
            sequential = []
            for _ in range(rounds):
                if pooled:
                    await refilled(lazy, 1)
                sequential.append(await one_round(lazy))
            bursts: list[tuple[float, float]] = []
            for _ in range(max(1, rounds // size)):
                if pooled:
                    await refilled(lazy, size)
                bursts += await burst(lazy, size)
            pool = lazy.pool.status() if lazy.pool is not None else None
        finally:
            await lazy.aclose()
        mode = "pooled" if pooled else "cold"
        out.append({"runtime": name, "mode": mode, "pattern": "one at a time",
                    **summary(sequential), "pool": pool})
        out.append({"runtime": name, "mode": mode, "pattern": f"bursts of {size}",
                    **summary(bursts), "pool": pool})
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--runtimes", default="bubblewrap,local")
    args = parser.parse_args()
    status = availability()
    load_at_start = os.getloadavg()  # (the machine may be shared: what else ran)
    results, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="rollserve-bench-") as state_dir:
        for name in args.runtimes.split(","):
            if status.get(name):
                skipped[name] = status[name]
                continue
            results += await measure(name, args.rounds, args.burst, state_dir)
    columns = ["runtime", "mode", "pattern", "n", "acquire p50 ms", "acquire p95 ms",
               "round p50 ms", "round p95 ms"]
    rows = [[r["runtime"], r["mode"], r["pattern"], r["n"], r["acquire_p50_ms"],
             r["acquire_p95_ms"], r["round_p50_ms"], r["round_p95_ms"]] for r in results]
    report("sandbox_pool", "sandbox acquisition: warm pool vs cold start", columns, rows,
           {"config": {"rounds": args.rounds, "burst": args.burst, "euid": os.geteuid(),
                       "load_avg_at_start": load_at_start, "load_avg_at_end": os.getloadavg()},
            "results": results, "skipped": skipped,
            "target": {"pooled_acquire_p50_ms": 2, "cold_round_p50_ms": 20}})
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")


if __name__ == "__main__":
    asyncio.run(main())

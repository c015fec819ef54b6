"""Sandbox start: start -> first shell prompt -> close, per runtime available here.

Each round starts a sandbox, opens an interactive bash on a PTY inside it (what the
bash tool does first), waits for its prompt, and closes the sandbox (which kills the
shell and removes the folders and the owner record). Reports the median and p95 of
the whole round and of each part. Target: bubblewrap median <= 20 ms.

    python -m benchmarks.sandbox_start [--rounds 100] [--runtimes bubblewrap,local,podman]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from benchmarks.common import median, percentile, report
from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.registry import availability, get_runtime

PROMPT = b"__rollserve_ready__$ "


async def open_shell(sandbox):
    """An interactive bash on a PTY in ``sandbox`` (what the bash tool opens first)."""
    return await sandbox.spawn(["bash", "--norc", "--noprofile", "-i"], pty=True,
                               env={"PS1": PROMPT.decode()})


async def wait_prompt(shell) -> None:
    """Read ``shell`` until its prompt (each read bounded at 30 s)."""
    output = b""
    while PROMPT not in output:
        chunk = await asyncio.wait_for(shell.read(), 30)
        if not chunk:
            raise RuntimeError(f"shell ended before its prompt: {output!r}")
        output += chunk


async def one_round(runtime, spec: SandboxSpec) -> tuple[float, float, float]:
    started = time.perf_counter()
    sandbox = await runtime.start(spec)
    shell = await open_shell(sandbox)
    up = time.perf_counter()
    await wait_prompt(shell)
    prompt = time.perf_counter()
    await sandbox.close()
    closed = time.perf_counter()
    return up - started, prompt - up, closed - prompt


async def measure(name: str, rounds: int, state_dir: str, image: str | None) -> dict:
    runtime = get_runtime(name, state_dir)
    spec = SandboxSpec(image=image)
    await one_round(runtime, spec)  # warm-up: page cache, first imports
    totals, starts, prompts, closes = [], [], [], []
    for _ in range(rounds):
        start, prompt, close = await one_round(runtime, spec)
        starts.append(start)
        prompts.append(prompt)
        closes.append(close)
        totals.append(start + prompt + close)
    ms = lambda values, q=None: 1000 * (median(values) if q is None else percentile(values, q))  # noqa: E731
    return {"runtime": name, "rounds": rounds,
            "median_ms": ms(totals), "p95_ms": ms(totals, 95),
            "start_median_ms": ms(starts), "prompt_median_ms": ms(prompts),
            "close_median_ms": ms(closes), "note": getattr(runtime, "limits_note", lambda: "")()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--runtimes", default="bubblewrap,local,podman,docker,apptainer")
    parser.add_argument("--image", default=None, help="image for container runtimes")
    args = parser.parse_args()
    status = availability()
    load_at_start = os.getloadavg()  # (the machine may be shared: what else ran)
    results, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="rollserve-bench-") as state_dir:
        for name in args.runtimes.split(","):
            if status.get(name):
                skipped[name] = status[name]
                continue
            needs_image = name in ("podman", "docker", "apptainer", "singularity")
            if needs_image and not args.image:
                skipped[name] = "needs --image (an image already present here)"
                continue
            try:
                results.append(await measure(name, args.rounds, state_dir,
                                             args.image if needs_image else None))
            except Exception as error:  # a runtime that cannot run here: say why, go on
                skipped[name] = f"{type(error).__name__}: {error}"[:300]
    columns = ["runtime", "rounds", "median ms", "p95 ms", "start ms", "prompt ms", "close ms"]
    rows = [[r["runtime"], r["rounds"], r["median_ms"], r["p95_ms"], r["start_median_ms"],
             r["prompt_median_ms"], r["close_median_ms"]] for r in results]
    report("sandbox_start", "start -> first shell prompt -> close", columns, rows,
           {"config": {"rounds": args.rounds, "euid": os.geteuid(), "image": args.image,
                       "load_avg_at_start": load_at_start, "load_avg_at_end": os.getloadavg()},
            "results": results, "skipped": skipped, "target": {"bubblewrap_median_ms": 20}})
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")


if __name__ == "__main__":
    asyncio.run(main())

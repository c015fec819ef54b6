"""The resident memory cap (sandbox/rsscap.py): how far past it a process allocating as
fast as it can gets before the kill, and what a reading costs.

In a bubblewrap sandbox with ``memory_mode="resident"`` and a ``--cap`` MB cap, a
program (Python: ``bytes * n``; Node: ``Buffer.alloc(n, 1)``) allocates and touches
8 MB chunks in a tight loop, keeping them, up to ``--ceiling`` MB, and reports each
chunk on stdout (unbuffered). For each ``resident_poll`` in ``--polls``, ``--rounds``
runs: the watcher's reading that killed it and the program's last report, each minus
the cap (the overshoot: the last report is a lower bound of what it held when it
died). The allocation rate is measured by the same program under a cap it never
reaches (``--ceiling`` MB, timed inside). The reading's cost: ``resident_usage`` over
a tree of 1 and of 64 sleeping processes (RSS under the cap; PSS past it).

    python -m benchmarks.rss_overshoot [--cap 512] [--ceiling 3072] [--polls 0.05 0.1 0.25] [--rounds 5]

Needs a server that can run bubblewrap without a delegated cgroup (with one, the
cgroup is the cap).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.common import report
from rollserve.sandbox import rsscap
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.config import BubblewrapConfig

MB = 1 << 20
PYTHON = """
import sys, time
held, start = [], time.monotonic()
for i in range(int(sys.argv[1]) // 8):
    held.append(bytes([i % 250 + 1]) * (8 << 20))
    sys.stdout.write(f"{8 * (i + 1)}\\n")
    sys.stdout.flush()
print("seconds", time.monotonic() - start, flush=True)
"""
NODE = """
const fs = require("fs");
const held = [], start = process.hrtime.bigint();
for (let i = 0; i < Number(process.argv[1]) / 8; i++) {
  held.push(Buffer.alloc(8 << 20, i % 250 + 1));
  fs.writeSync(1, `${8 * (i + 1)}\\n`);
}
fs.writeSync(1, `seconds ${Number(process.hrtime.bigint() - start) / 1e9}\\n`);
"""


def argv(kind: str, ceiling: int) -> list[str]:
    if kind == "python":
        return ["python3", "-c", PYTHON, str(ceiling)]
    return ["node", "-e", NODE, str(ceiling)]


def last_report(stdout: str) -> int:
    numbers = [int(line) for line in stdout.split("\n") if line.isdigit()]
    return numbers[-1] if numbers else 0


async def rate(runtime: BubblewrapRuntime, kind: str, ceiling: int) -> float:
    """MB/s the program allocates at, under a cap it never reaches."""
    spec = SandboxSpec(limits=SandboxLimits(memory_mb=ceiling * 4, memory_mode="resident"))
    async with await runtime.start(spec) as box:
        result = await box.exec(argv(kind, ceiling), 120)
    seconds = float(result.stdout.split("seconds")[-1])
    return ceiling / seconds


async def overshoot(state: Path, kind: str, cap: int, ceiling: int, poll: float,
                    rounds: int) -> tuple[list[int], list[int], int]:
    """(reading at the kill - cap, last report - cap) per round, in MB; and how many
    rounds ended without a kill (the program reached the ceiling first)."""
    runtime = BubblewrapRuntime(state, BubblewrapConfig(resident_poll=poll))
    readings, reports, missed = [], [], 0
    for _ in range(rounds):
        spec = SandboxSpec(limits=SandboxLimits(memory_mb=cap, memory_mode="resident"))
        async with await runtime.start(spec) as box:
            result = await box.exec(argv(kind, ceiling), 120)
            assert box.resident is not None
            if result.cap != "memory":
                missed += 1
                continue
            readings.append(box.resident.killed_at // MB - cap)
            reports.append(last_report(result.stdout) - cap)
    return readings, reports, missed


def reading_cost(processes: int, limit: int, repeat: int = 200) -> float:
    """Seconds one ``resident_usage`` takes over a tree of ``processes`` sleepers."""
    tree = subprocess.Popen(["bash", "-c", f"for i in $(seq {processes - 1}); do sleep 300 & done; "
                             "sleep 300"])
    try:
        for _ in range(200):  # (wait until the tree is complete: bounded)
            if len(rsscap.tree_pids([tree.pid])) >= processes:
                break
            time.sleep(0.05)
        start = time.perf_counter()
        for _ in range(repeat):
            rsscap.resident_usage([tree.pid], limit)
        return (time.perf_counter() - start) / repeat
    finally:
        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=512, help="memory_mb (MB)")
    parser.add_argument("--ceiling", type=int, default=3072, help="MB the program stops at")
    parser.add_argument("--polls", type=float, nargs="+", default=[0.05, 0.1, 0.25])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if reason := BubblewrapRuntime.unavailable_reason():
        sys.exit(f"bubblewrap unavailable: {reason}")
    kinds = ["python"] + (["node"] if shutil.which("node") else [])
    rows, data = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        runtime = BubblewrapRuntime(Path(tmp) / "rate")
        if runtime.cgroup_parent is not None:
            sys.exit("a delegated cgroup bounds the sandboxes here: the cgroup is the cap")
        for kind in kinds:
            mb_s = await rate(runtime, kind, args.ceiling)
            for poll in args.polls:
                readings, reports, missed = await overshoot(
                    Path(tmp) / f"{kind}-{poll}", kind, args.cap, args.ceiling, poll, args.rounds)
                rows.append([kind, round(mb_s), poll, round(mb_s * poll),
                             statistics.median(readings) if readings else "-",
                             max(readings) if readings else "-",
                             statistics.median(reports) if reports else "-",
                             max(reports) if reports else "-", missed])
                data[f"{kind}-{poll}"] = {"rate_mb_s": mb_s, "readings": readings,
                                          "reports": reports, "missed": missed}
    costs = {n: reading_cost(n, 1 << 40) for n in (1, 64)}
    costs_pss = {n: reading_cost(n, 0) for n in (1, 64)}
    data["reading_seconds"] = {"rss": costs, "pss": costs_pss}
    print(f"one reading: RSS over 1 / 64 processes {costs[1] * 1e3:.2f} / {costs[64] * 1e3:.2f} ms; "
          f"PSS {costs_pss[1] * 1e3:.2f} / {costs_pss[64] * 1e3:.2f} ms")
    report("rss_overshoot", f"resident cap {args.cap} MB: MB past it at the kill",
           ["program", "MB/s", "poll s", "MB/s x poll", "reading p50", "reading max",
            "last report p50", "last report max", "no kill"], rows,
           {"cap_mb": args.cap, "ceiling_mb": args.ceiling, **data})


if __name__ == "__main__":
    asyncio.run(main())

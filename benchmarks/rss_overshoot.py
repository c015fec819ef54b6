"""The resident memory cap (sandbox/rsscap.py): how far past it a process allocating as
fast as it can gets before the kill, and what a reading costs.

In a bubblewrap sandbox with ``memory_mode="resident"`` and a ``--cap`` MB cap, a
program (Python: ``bytes * n``; Node: ``Buffer.alloc(n, 1)``; populate: Python's
``mmap`` with ``MAP_POPULATE``, the kernel zero-filling each chunk in the one call, the
fastest a process grows) allocates and touches 8 MB chunks in a tight loop, keeping
them, up to ``--ceiling`` MB, and reports each chunk on stdout (unbuffered). For each
``resident_poll`` in ``--polls``, ``--rounds`` runs: the watcher's reading that killed
it and the program's last report, each minus the cap (the overshoot: the last report
is a lower bound of what it held when it died), and the killing reading's time. The
allocation rate is measured by the same program under a cap it never reaches
(``--ceiling`` MB, timed inside). The table's bounds: that rate x (poll + the longest
killing reading), and that rate x the longest time from the start of the last reading
under the cap to the kill's end (poll + that reading + the killing reading + the kill +
the event loop's lag: what a loaded server stretches). The load average (1 min) before
and after goes in the JSON. The reading's cost: ``resident_usage`` over a tree of 1 and of 64
sleeping processes (RSS under the cap; PSS past it).

    python -m benchmarks.rss_overshoot [--cap 512] [--ceiling 3072] [--polls 0.05 0.1 0.25] [--rounds 5]

With ``--walks`` instead (``results/rss_tree_walk.json``): one walk of a tree of 1 and
of 64 processes through the ``children`` files and by a pass over all of /proc (the
fallback of a kernel without them), and how many processes the host has.

With ``--shared SECONDS`` instead (``results/rss_pss_share.json``): what PSS costs the
server when a sandbox keeps its RSS sum past the cap while holding less (a parent
and ``--children`` children sharing a 256 MB mapping, cap 1024 MB, poll 0.1 s), for
``SECONDS`` each: PSS passes spaced by their own time (the watcher as it is) and a
pass on every poll (the old way: the spacing reset before each reading); the share of
wall time spent in PSS passes, and the readings of each kind.

Needs a server that can run bubblewrap without a delegated cgroup (with one, the
cgroup is the cap).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import report
from rollserve.sandbox import proctree, rsscap
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

POPULATE = """
import mmap, sys, time
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0x8000)
held, start = [], time.monotonic()
for i in range(int(sys.argv[1]) // 8):
    held.append(mmap.mmap(-1, 8 << 20, flags=flags))
    sys.stdout.write(f"{8 * (i + 1)}\\n")
    sys.stdout.flush()
print("seconds", time.monotonic() - start, flush=True)
"""


def argv(kind: str, ceiling: int) -> list[str]:
    if kind == "node":
        return ["node", "-e", NODE, str(ceiling)]
    return ["python3", "-c", POPULATE if kind == "populate" else PYTHON, str(ceiling)]


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
                    rounds: int) -> dict[str, Any]:
    """Per round: the reading at the kill - cap and the last report - cap (MB), the
    killing reading's seconds; and how many rounds ended without a kill (the program
    reached the ceiling first)."""
    runtime = BubblewrapRuntime(state, BubblewrapConfig(resident_poll=poll))
    readings: list[int] = []
    reports: list[int] = []
    seconds: list[float] = []
    spans: list[float] = []
    missed = 0
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
            watch = box.resident
            seconds.append(watch.reading_seconds)
            # From the start of the last reading under the cap to the kill's end.
            spans.append(watch.gap_seconds + watch.reading_seconds + watch.kill_seconds)
    return {"readings": readings, "reports": reports, "reading_seconds": seconds,
            "span_seconds": spans, "missed": missed}


SHARERS = """
import mmap, os, sys, time
size = 256 << 20
m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
chunk = b"x" * (1 << 20)
for offset in range(0, size, len(chunk)):
    m[offset:offset + len(chunk)] = chunk
for i in range(int(sys.argv[1])):
    if os.fork() == 0:
        total = sum(m[offset] for offset in range(0, size, 4096))
        time.sleep(600)
        os._exit(0)
time.sleep(600)
"""


async def pss_share(state: Path, children: int, seconds: float, spaced: bool) -> dict[str, Any]:
    """Over ``seconds`` of a sandbox of sharers past the RSS cap: the share of wall time
    its watcher spent in PSS passes, and its readings by kind."""
    runtime = BubblewrapRuntime(state, BubblewrapConfig(resident_poll=0.1))
    spec = SandboxSpec(limits=SandboxLimits(memory_mb=1024, pids=children + 16,
                                            memory_mode="resident"))
    async with await runtime.start(spec) as box:
        watch = box.resident
        assert watch is not None
        process = await box.spawn(["python3", "-c", SHARERS, str(children)])
        for _ in range(1200):  # until every child has read the mapping (bounded)
            if watch.counts["pss"] >= 1 and watch.used > 256 * MB:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)  # (the children finish reading)
        totals = {"pss_seconds": 0.0, "readings": 0, "pss": 0}
        check = watch.check

        async def counted() -> int:
            if not spaced:
                watch.pss_due = 0.0
            used = await check()
            totals["readings"] += 1
            if watch.how.startswith("pss"):
                totals["pss"] += 1
                totals["pss_seconds"] += watch.reading_seconds
            return used
        watch.check = counted  # type: ignore[method-assign]
        await asyncio.sleep(seconds)
        watch.check = check  # type: ignore[method-assign]
        killed = watch.kills
        await process.kill()
    return {**totals, "share": totals["pss_seconds"] / seconds, "kills": killed,
            "last_mb": watch.used // MB, "last_how": watch.how}


@contextlib.contextmanager
def sleepers(processes: int) -> Iterator[int]:
    """A tree of ``processes`` sleeping processes (its root's pid), complete (a bounded
    wait) before it is used, and killed after."""
    tree = subprocess.Popen(["bash", "-c", f"for i in $(seq {processes - 1}); do sleep 300 & done; "
                             "sleep 300"])
    try:
        for _ in range(200):  # (wait until the tree is complete: bounded)
            if len(proctree.tree_pids([tree.pid])) >= processes:
                break
            time.sleep(0.05)
        yield tree.pid
    finally:
        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()


def walk_cost(processes: int, by_children: bool, repeat: int = 50) -> float:
    """Seconds one ``proctree.tree_pids`` takes over a tree of ``processes`` sleepers."""
    with sleepers(processes) as root:
        start = time.perf_counter()
        for _ in range(repeat):
            proctree.tree_pids([root], by_children)
        return (time.perf_counter() - start) / repeat


def walks() -> None:
    """The tree walk's cost both ways (``results/rss_tree_walk.json``)."""
    rows, data = [], {}
    host = len(psutil.pids())
    for processes in (1, 64):
        files, everything = walk_cost(processes, True), walk_cost(processes, False)
        rows.append([processes, host, round(files * 1e3, 2), round(everything * 1e3, 2)])
        data[str(processes)] = {"children_files_s": files, "all_of_proc_s": everything}
    report("rss_tree_walk", "finding a sandbox's processes: one walk, ms",
           ["processes in the tree", "processes on the host", "children files",
            "all of /proc (no CONFIG_PROC_CHILDREN)"], rows,
           {"host_processes": host, **data})


def reading_cost(processes: int, limit: int, repeat: int = 200) -> float:
    """Seconds one ``resident_usage`` takes over a tree of ``processes`` sleepers."""
    with sleepers(processes) as root:
        start = time.perf_counter()
        for _ in range(repeat):
            rsscap.resident_usage([root], limit)
        return (time.perf_counter() - start) / repeat


async def shared(seconds: float, children: int) -> None:
    rows, data = [], {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for spaced in (False, True):
            name = "spaced" if spaced else "every poll (old)"
            got = await pss_share(Path(tmp) / name, children, seconds, spaced)
            rows.append([name, got["readings"], got["pss"], round(got["pss_seconds"], 2),
                         f"{got['share']:.0%}", f"{got['last_mb']} ({got['last_how']})",
                         got["kills"]])
            data[name] = got
    report("rss_pss_share", f"PSS cost: {children + 1} processes sharing 256 MB, RSS sum past "
           f"a 1024 MB cap, poll 0.1 s, {seconds:g} s each",
           ["PSS passes", "readings", "PSS readings", "PSS seconds", "share of wall time",
            "last reading MB (how)", "kills"], rows,
           {"children": children, "seconds": seconds,
            "load_average_1m": [load_before, os.getloadavg()[0]], **data})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=512, help="memory_mb (MB)")
    parser.add_argument("--ceiling", type=int, default=3072, help="MB the program stops at")
    parser.add_argument("--polls", type=float, nargs="+", default=[0.05, 0.1, 0.25])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shared", type=float, default=None,
                        help="seconds: measure PSS's cost with sharers instead")
    parser.add_argument("--children", type=int, default=12)
    parser.add_argument("--walks", action="store_true",
                        help="measure the process-tree walk both ways instead")
    args = parser.parse_args()
    if reason := BubblewrapRuntime.unavailable_reason():
        sys.exit(f"bubblewrap unavailable: {reason}")
    if args.walks:
        walks()
        return
    if args.shared is not None:
        await shared(args.shared, args.children)
        return
    kinds = ["python", "populate"] + (["node"] if shutil.which("node") else [])
    rows, data = [], {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runtime = BubblewrapRuntime(Path(tmp) / "rate")
        if runtime.cgroup_parent is not None:
            sys.exit("a delegated cgroup bounds the sandboxes here: the cgroup is the cap")
        for kind in kinds:
            mb_s = await rate(runtime, kind, args.ceiling)
            for poll in args.polls:
                got = await overshoot(Path(tmp) / f"{kind}-{poll}", kind, args.cap,
                                      args.ceiling, poll, args.rounds)
                readings, reports = got["readings"], got["reports"]
                reading = max(got["reading_seconds"], default=0.0)
                span = max(got["span_seconds"], default=0.0)
                rows.append([kind, round(mb_s), poll, round(reading * 1e3, 1),
                             round(mb_s * (poll + reading)), round(span * 1e3),
                             round(mb_s * span),
                             statistics.median(readings) if readings else "-",
                             max(readings) if readings else "-",
                             statistics.median(reports) if reports else "-",
                             max(reports) if reports else "-", got["missed"]])
                data[f"{kind}-{poll}"] = {"rate_mb_s": mb_s, **got}
    costs = {n: reading_cost(n, 1 << 40) for n in (1, 64)}
    costs_pss = {n: reading_cost(n, 0) for n in (1, 64)}
    data["reading_seconds"] = {"rss": costs, "pss": costs_pss}
    print(f"one reading: RSS over 1 / 64 processes {costs[1] * 1e3:.2f} / {costs[64] * 1e3:.2f} ms; "
          f"PSS {costs_pss[1] * 1e3:.2f} / {costs_pss[64] * 1e3:.2f} ms")
    report("rss_overshoot", f"resident cap {args.cap} MB: MB past it at the kill",
           ["program", "MB/s", "poll s", "killing reading ms max", "MB/s x (poll + reading)",
            "last under-cap reading to kill ms max", "MB/s x that", "reading p50", "reading max",
            "last report p50", "last report max", "no kill"], rows,
           {"cap_mb": args.cap, "ceiling_mb": args.ceiling,
            "load_average_1m": [load_before, os.getloadavg()[0]], **data})


if __name__ == "__main__":
    asyncio.run(main())

"""2,000 math rollouts in flight at once against the test-double LLM.

The server runs as its own process (`rollserve serve`), the test-double vLLM as
another (200 ms per call, two turns per episode), and this script is the trainer:
it submits everything, then polls the API while the batch runs and streams results
by cursor. Reports: all complete and none lost, the server's peak RSS, its CPU time
per rollout (the server process alone, and with its scoring workers), and p50/p99
latency of API calls made under that load.

``--before PATH`` (an old tree's ``src``, from ``git worktree add`` or ``git archive``)
runs a server of that tree and one of this tree in turn, ``--rounds`` times each, the
order alternating round by round, each against its own test double: old and new see
the same machine over time. The 1-minute load average is recorded before each run
(``--out`` names the JSON; the default keeps ``concurrency.json``).

    python -m benchmarks.concurrency [--rollouts 2000] [--latency 0.2]
    python -m benchmarks.concurrency --before /tmp/old/src --rounds 2 --out concurrency_ab
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.common import fake_llm, free_port, median, percentile, report, wait_http
from rollserve.client import AsyncClient
from rollserve.contract import RolloutResult

SRC = Path(__file__).resolve().parents[1] / "src"


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of the server and its children (the scoring workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


async def trainer(url: str, rollouts: int, server: psutil.Process) -> dict:
    latencies: dict[str, list[float]] = {"submit": [], "status": [], "rollout": []}
    peak_rss = server.memory_info().rss
    peak_tree_rss = tree_rss(server)
    cpu_before = tree_cpu(server)
    own = server.cpu_times()
    own_before = own.user + own.system
    tasks = [{"data_source": "math", "n": 4,
              "instance": {"question": f"What is {i} + {i}?", "answer": str(2 * i)}}
             for i in range(rollouts // 4)]
    results: list[RolloutResult] = []
    async with AsyncClient(url, timeout=120) as client:
        started = time.perf_counter()
        ids: list[str] = []
        for chunk in range(0, len(tasks), 50):
            t0 = time.perf_counter()
            accepted = await client.submit(tasks[chunk:chunk + 50], sampling={"max_tokens": 32})
            latencies["submit"].append(time.perf_counter() - t0)
            ids += [rid for g in accepted.groups for rid in g.rollout_ids]
        max_in_flight = 0

        async def poll(offset: int) -> None:
            """One of two trainers' monitors: status and a rollout, back to back."""
            nonlocal peak_rss, peak_tree_rss, max_in_flight
            i = offset
            while len(results) < rollouts:
                t0 = time.perf_counter()
                status = await client.status()
                latencies["status"].append(time.perf_counter() - t0)
                max_in_flight = max(max_in_flight, status.in_flight)
                t0 = time.perf_counter()
                await client.rollout(ids[i % len(ids)])
                latencies["rollout"].append(time.perf_counter() - t0)
                peak_rss = max(peak_rss, server.memory_info().rss)
                peak_tree_rss = max(peak_tree_rss, tree_rss(server))
                i += 7

        poller = asyncio.gather(poll(0), poll(3))
        cursor = 0
        while len(results) < rollouts:
            page = await client.results(after=cursor, limit=1000, wait=5)
            results += page.results
            cursor = page.next
        elapsed = time.perf_counter() - started
        await poller
    cpu = tree_cpu(server) - cpu_before
    own = server.cpu_times()
    own_cpu = own.user + own.system - own_before
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "rollouts": rollouts, "seconds": elapsed, "statuses": statuses,
        "unique_results": len({r.id for r in results}),
        "all_submitted_came_back": sorted(r.id for r in results) == sorted(ids),
        "max_in_flight": max_in_flight,
        "peak_rss_mb": peak_rss / 2**20,
        "peak_rss_with_scoring_workers_mb": peak_tree_rss / 2**20,
        "server_cpu_seconds": cpu, "cpu_ms_per_rollout": 1000 * cpu / rollouts,
        "server_process_cpu_ms_per_rollout": 1000 * own_cpu / rollouts,
        "llm_calls": sum(r.stats.turns for r in results),
        "latency_ms": {k: {"p50": 1000 * median(v), "p99": 1000 * percentile(v, 99), "n": len(v)}
                       for k, v in latencies.items()},
    }


def run_once(src: Path, rollouts: int, latency: float) -> dict:
    """One server of the tree at ``src`` (its own test double and state), one batch."""
    llm_port, api_port = free_port(), free_port()
    state = tempfile.mkdtemp(prefix="rollserve-bench-")
    fake = fake_llm(llm_port, latency, "Let me think about it.", "So \\boxed{2}.")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(SRC.parent)])}
    server = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(api_port),
         "--state-dir", state, "--backend", f"http://127.0.0.1:{llm_port}",
         "--init-workers", str(rollouts), "--run-workers", str(rollouts), "--eval-workers", "64",
         "--max-pending", str(rollouts), "--log-level", "warning"], env=env)
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/health", fake)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server)
        load = os.getloadavg()[0]
        data = asyncio.run(trainer(f"http://127.0.0.1:{api_port}", rollouts, psutil.Process(server.pid)))
    finally:
        for proc in (server, fake):
            proc.terminate()
            proc.wait(timeout=30)
    data["load_avg_1m_before"] = load
    assert data["all_submitted_came_back"] and data["statuses"] == {"completed": rollouts}, data["statuses"]
    return data


def _rows(data: dict, rollouts: int) -> list[list]:
    lat = data["latency_ms"]
    return [
        ["rollouts completed", f"{data['statuses'].get('completed', 0)} / {rollouts}"],
        ["unique results (none lost, none twice)", data["unique_results"]],
        ["max in flight", data["max_in_flight"]],
        ["wall seconds", round(data["seconds"], 2)],
        ["server peak RSS (MB)", round(data["peak_rss_mb"], 1)],
        ["  with scoring workers (MB)", round(data["peak_rss_with_scoring_workers_mb"], 1)],
        ["server CPU ms per rollout (incl. scoring)", round(data["cpu_ms_per_rollout"], 2)],
        ["GET /v1/status p50 / p99 (ms)", f"{lat['status']['p50']:.1f} / {lat['status']['p99']:.1f}"],
        ["GET /v1/rollouts/{id} p50 / p99 (ms)", f"{lat['rollout']['p50']:.1f} / {lat['rollout']['p99']:.1f}"],
        ["POST /v1/rollouts (50 tasks x 4) p50 / p99 (ms)", f"{lat['submit']['p50']:.1f} / {lat['submit']['p99']:.1f}"],
    ]


def _ab_rows(runs: dict[str, list[dict]]) -> list[list]:
    """One row per run: the tree, the round, the load, and the measures."""
    rows = []
    for label, datas in runs.items():
        for i, d in enumerate(datas):
            lat = d["latency_ms"]
            rows.append([label, i + 1, round(d["load_avg_1m_before"], 2), d["max_in_flight"],
                         round(d["server_process_cpu_ms_per_rollout"], 2), round(d["cpu_ms_per_rollout"], 2),
                         round(d["peak_rss_mb"], 1),
                         f"{lat['status']['p50']:.1f} / {lat['status']['p99']:.1f}",
                         f"{lat['rollout']['p50']:.1f} / {lat['rollout']['p99']:.1f}",
                         f"{lat['submit']['p50']:.1f} / {lat['submit']['p99']:.1f}"])
    return rows


def main(rollouts: int, latency: float, before: Path | None, rounds: int, out: str) -> None:
    config = {"rollouts": rollouts, "llm_latency_s": latency, "turns_per_rollout": 2,
              "cores": psutil.cpu_count()}
    if before is None:
        data = run_once(SRC, rollouts, latency)
        report(out, f"{rollouts} in-flight math rollouts, test-double LLM at {latency * 1000:.0f} ms/call",
               ["measure", "value"], _rows(data, rollouts), {"config": config, "results": data})
        return
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    trees = {"before": before, "after": SRC}
    for r in range(rounds):
        for label in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            runs[label].append(run_once(trees[label], rollouts, latency))
    report(out, f"{rollouts} in-flight math rollouts, old tree vs new, alternated, {rounds} rounds, "
           f"test-double LLM at {latency * 1000:.0f} ms/call",
           ["tree", "round", "load avg (1 min) before", "max in flight", "server CPU ms/rollout",
            "  with scoring workers", "server peak RSS (MB)", "GET /v1/status p50 / p99 (ms)",
            "GET /v1/rollouts/{id} p50 / p99 (ms)", "POST /v1/rollouts (200) p50 / p99 (ms)"],
           _ab_rows(runs), {"config": {**config, "before_src": str(before), "rounds": rounds},
                            "results": runs})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--before", type=Path, default=None, help="the old tree's src folder")
    parser.add_argument("--rounds", type=int, default=2, help="with --before: runs of each tree")
    parser.add_argument("--out", default="concurrency", help="the JSON's name under benchmarks/results")
    args = parser.parse_args()
    main(args.rollouts, args.latency, args.before, args.rounds, args.out)

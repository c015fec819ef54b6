"""Many math rollouts in flight at once against the test-double LLM.

The server runs as its own process (`rollserve serve`), the test-double vLLM as ``--ports``
others (one per port, each a ``--backend`` of the server; ``--latency`` seconds per
call, two turns per episode), and this script is the trainer: it submits everything in
bodies of ``--tasks-per-post`` tasks (``--n`` samples each) and streams the results by
cursor. A probe in its own process (``benchmarks.concurrency_probe``) asks
``GET /v1/status`` and ``GET /v1/rollouts/{id}`` every ``--probe-period`` seconds from
the first submit to the last result, and samples the server's RSS: latency throughout,
"max in flight" as the server counts it. Reports: all complete and none lost or twice,
peak RSS, server CPU per rollout (the server process alone, and with its scoring
workers), p50/p99 latency of each API call (status and get also at >= 90% of the peak in
flight), and the load average while it ran.

The file-descriptor limit (RLIMIT_NOFILE) of this process is raised to its hard limit
and the server and doubles inherit it; ``--max-pending`` (default: ``--rollouts``) is
the server's admission limit and its INIT and RUN stages' worker counts (it is started
with ``--max-pending N --init-workers N --run-workers N --eval-workers 64``),
``--max-connections`` (default: the server's own) each backend's connection pool bound.

``--gate`` starts the doubles paused: every call waits until all ``--rollouts`` are
admitted and in flight (the server's count), then the doubles answer (after
``--latency`` each) and everything runs to completion: "max in flight" is all of them
and each must complete exactly once.

``--profile`` starts the server with a loop-lag probe (and tracemalloc snapshots with
``ROLLSERVE_BENCH_TRACEMALLOC=1``) written under the JSON's ``profile``.

``--before PATH`` (an old tree's ``src``, from ``git archive``) runs a server of that
tree and one of this tree in turn, ``--rounds`` times each, the order alternating
round by round, each against its own test doubles: old and new see the same machine
over time (``--out`` names the JSON; the default keeps ``concurrency.json``).
``--before-args`` gives the "before" server more options: ``--before src --before-args
'--rollout-slice-ms 0'`` compares one tree with and without a setting.

    python -m benchmarks.concurrency [--rollouts 2000] [--latency 0.2]
    python -m benchmarks.concurrency --rollouts 65000 --ports 4 --latency 3000 --backend-timeout 7200 \\
        --max-connections 512 --tasks-per-post 1000 --probe-period 0.5 --profile --hold 240 --out concurrency_65k_held
    python -m benchmarks.concurrency --rollouts 65000 --ports 4 --latency 0.05 --gate --backend-timeout 7200 \
        --max-connections 512 --tasks-per-post 1000 --probe-period 0.5 --profile --out concurrency_65k
    python -m benchmarks.concurrency --before /tmp/old/src --rollouts 5000 --rounds 2 --out concurrency_ab
    python -m benchmarks.concurrency --before src --before-args '--rollout-slice-ms 0' --rollouts 20000 --gate ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
import psutil

from benchmarks.common import fake_llm, free_port, median, percentile, report, state_dir, terminate, wait_http
from benchmarks.concurrency_probe import probe
from rollserve.client import AsyncClient
from rollserve.contract import RolloutResult

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass
class Setup:
    rollouts: int = 2000
    latency: float = 0.2
    ports: int = 1
    n: int = 4
    tasks_per_post: int = 50
    max_pending: int | None = None
    max_connections: int | None = None
    probe_period: float = 0.25
    profile: bool = False
    hold: float | None = None
    backend_timeout: float | None = None
    gate: bool = False  # the doubles hold every call until all are admitted, then answer
    server_args: tuple[str, ...] = ()  # more `rollserve serve` options (benchmarks.gc_pause)


def raise_fd_limit() -> tuple[int, int]:
    """RLIMIT_NOFILE's soft limit up to the hard one (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


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


def summary(values: list[float]) -> dict:
    return {"p50": 1000 * median(values), "p99": 1000 * percentile(values, 99),
            "max": 1000 * max(values, default=float("nan")), "n": len(values)}


def digest(samples: list[tuple[float, str, float, int]]) -> dict:
    """The probe's samples as latency summaries (all, and at >= 90% of the peak in
    flight), peaks, and a series of 10-second buckets."""
    by: dict[str, list[tuple[float, float, int]]] = {}
    for t, kind, value, flight in samples:
        by.setdefault(kind, []).append((t, value, flight))
    peak = max((f for _, _, f in by.get("status", [])), default=0)
    series: dict[int, dict] = {}
    for kind in ("status", "rollout", "rss"):
        for t, value, flight in by.get(kind, []):
            row = series.setdefault(int(t // 10) * 10, {"t": int(t // 10) * 10, "in_flight": 0})
            row["in_flight"] = max(row["in_flight"], flight)
            key = {"status": "status_max_ms", "rollout": "rollout_max_ms", "rss": "rss_mb"}[kind]
            scaled = 1000 * value if kind != "rss" else value / 2**20
            row[key] = round(max(row.get(key, 0.0), scaled), 1)
    return {
        "max_in_flight": peak,
        "latency_ms": {k: summary([v for _, v, _ in by.get(k, [])]) for k in ("status", "rollout")},
        "latency_at_peak_ms": {k: summary([v for _, v, f in by.get(k, []) if f >= 0.9 * peak])
                               for k in ("status", "rollout")},
        "peak_rss_mb": max((v for _, v, _ in by.get("rss", [])), default=0) / 2**20,
        # (None when the first submit was admitted before the probe's first sample)
        "rss_before_first_submit_mb": next((v / 2**20 for _, v, f in by.get("rss", []) if f == 0), None),
        "peak_rss_with_scoring_workers_mb": max((v for _, v, _ in by.get("tree_rss", [])), default=0) / 2**20,
        "load_avg_1m_max": max((v for _, v, _ in by.get("load", [])), default=0.0),
        "load_avg_1m_median": median([v for _, v, _ in by.get("load", [])]),
        "series_10s": [series[k] for k in sorted(series)],
        **_loop_thread(by),
    }


def _loop_thread(by: dict[str, list[tuple[float, float, int]]]) -> dict:
    """Over the run: the CPU seconds the server's event-loop thread ran, and the seconds
    it was runnable but waited for a CPU (the host's other work), from the probe."""
    cpu, queue = by.get("loop_cpu_s", []), by.get("loop_runqueue_s", [])
    if len(cpu) < 2 or len(queue) < 2:
        return {}
    wall = cpu[-1][0] - cpu[0][0]
    ran, waited = cpu[-1][1] - cpu[0][1], queue[-1][1] - queue[0][1]
    return {"loop_thread": {"wall_s": wall, "ran_s": ran, "waited_for_cpu_s": waited,
                            "ran_share": ran / wall if wall else 0.0,
                            "waited_share": waited / wall if wall else 0.0}}


GATE_TIMEOUT = 3600.0  # seconds the gate waits for every rollout to be in flight


async def open_gate(client: AsyncClient, doubles: list[str], submitting: asyncio.Task, admitted: list[str]) -> dict:
    """Once every rollout is submitted and in flight (the server's own count), the
    doubles, paused until now, answer: 65,000 in flight at once, then all run out."""
    await submitting
    began = time.perf_counter()
    while (status := await client.status()).in_flight < len(admitted):
        if time.perf_counter() - began > GATE_TIMEOUT:
            raise TimeoutError(f"{status.in_flight} of {len(admitted)} in flight after {GATE_TIMEOUT:g} s")
        await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as http:
        for double in doubles:
            async with http.post(f"{double}/resume") as resp:
                resp.raise_for_status()
    return {"in_flight_at_release": status.in_flight, "released_at": time.perf_counter()}


async def trainer(url: str, setup: Setup, server: psutil.Process, ids_out: mp.Queue,
                  doubles: list[str] | None = None) -> dict:
    submits: list[float] = []
    own = server.cpu_times()
    cpu_before, own_before = tree_cpu(server), own.user + own.system
    # Timeouts past the handler's defaults: the last rollouts queue behind the first
    # for the whole run (the benchmark measures holding them, not abandoning them).
    timeouts = {"total": 7200.0, "init": 3600.0, "run": 7200.0}
    tasks = [{"data_source": "math", "n": setup.n,
              "instance": {"question": f"What is {i} + {i}?", "answer": str(2 * i)}}
             for i in range(setup.rollouts // setup.n)]
    results: list[RolloutResult] = []
    ids: list[str] = []
    async with AsyncClient(url, timeout=600) as client:
        started = time.perf_counter()

        async def submit_all() -> None:
            for chunk in range(0, len(tasks), setup.tasks_per_post):
                t0 = time.perf_counter()
                accepted = await client.submit(tasks[chunk:chunk + setup.tasks_per_post],
                                               sampling={"max_tokens": 32}, timeouts=timeouts)
                submits.append(time.perf_counter() - t0)
                new = [rid for g in accepted.groups for rid in g.rollout_ids]
                ids.extend(new)
                ids_out.put(new)

        submitting = asyncio.create_task(submit_all())
        gate = asyncio.create_task(open_gate(client, doubles or [], submitting, ids)) if setup.gate else None
        cursor = 0
        if setup.hold is not None:  # admission and holding only: nothing is read back
            await submitting
            await asyncio.sleep(setup.hold)
        while setup.hold is None and len(results) < setup.rollouts:
            page = await client.results(after=cursor, limit=1000, wait=5)
            results += page.results
            cursor = page.next
            if submitting.done() and submitting.exception() is not None:
                break
            if gate is not None and gate.done() and gate.exception() is not None:
                break
        await submitting
        finished = time.perf_counter()
        elapsed = finished - started
        released = await gate if gate is not None else None
    cpu = tree_cpu(server) - cpu_before
    own = server.cpu_times()
    own_cpu = own.user + own.system - own_before
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "rollouts": setup.rollouts, "seconds": elapsed, "statuses": statuses,
        "unique_results": len({r.id for r in results}),
        "all_submitted_came_back": sorted(r.id for r in results) == sorted(ids),
        "server_cpu_seconds": cpu, "cpu_ms_per_rollout": 1000 * cpu / setup.rollouts,
        "server_process_cpu_ms_per_rollout": 1000 * own_cpu / setup.rollouts,
        "llm_calls": sum(r.stats.turns for r in results),
        "submit_latency_ms": summary(submits),
        "rollouts_per_post": setup.tasks_per_post * setup.n,
        "admitted": len(ids),
        "hold_s": setup.hold,
        **({"gate": {"in_flight_at_release": released["in_flight_at_release"],
                     "admit_s": released["released_at"] - started,
                     "release_to_last_result_s": finished - released["released_at"]}} if released else {}),
    }


def _backend(port: int, setup: Setup) -> str:
    spec: dict = {"url": f"http://127.0.0.1:{port}"}
    if setup.max_connections is not None:
        spec["max_connections"] = setup.max_connections
    if setup.backend_timeout is not None:
        spec["timeout"] = setup.backend_timeout
    return spec["url"] if len(spec) == 1 else json.dumps(spec)


def run_once(src: Path, setup: Setup) -> dict:
    """One server of the tree at ``src`` (its own test doubles and state), one batch."""
    llm_ports, api_port = [free_port() for _ in range(setup.ports)], free_port()
    state = state_dir()
    fakes = [fake_llm(p, setup.latency, "Let me think about it.", "So \\boxed{2}.", paused=setup.gate)
             for p in llm_ports]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(SRC.parent)])}
    lag_file = Path(state) / "loop_lag.jsonl"
    command = ["-m", "benchmarks.concurrency_probe", str(lag_file)] if setup.profile else ["-m", "rollserve.cli"]
    max_pending = setup.max_pending or setup.rollouts
    server = subprocess.Popen(
        [sys.executable, *command, "serve", "--port", str(api_port), "--state-dir", state,
         *[a for p in llm_ports for a in ("--backend", _backend(p, setup))],
         "--init-workers", str(max_pending), "--run-workers", str(max_pending), "--eval-workers", "64",
         "--max-pending", str(max_pending), "--log-level", "warning", *setup.server_args], env=env)
    ctx = mp.get_context("spawn")
    ids, stop, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    try:
        for port, fake in zip(llm_ports, fakes, strict=True):
            wait_http(f"http://127.0.0.1:{port}/health", fake, timeout=600)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server, timeout=600)  # a loaded host: slow imports
        load = os.getloadavg()[0]
        url = f"http://127.0.0.1:{api_port}"
        proc = psutil.Process(server.pid)
        prober = ctx.Process(target=probe, args=(url, server.pid, ids, stop, out, setup.probe_period))
        prober.start()
        try:
            data = asyncio.run(trainer(url, setup, proc, ids, [f"http://127.0.0.1:{p}" for p in llm_ports]))
        finally:
            stop.set()
            samples, peak_status = out.get(timeout=120)
            prober.join(timeout=30)
        data["server_nofile_limit"] = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
    finally:
        terminate(server, *fakes, timeout=120)  # (a server stopping 65,000 rollouts may take longer: killed)
    data.update(digest(samples), load_avg_1m_before=load, max_pending=max_pending, at_max_in_flight=peak_status)
    if setup.profile and lag_file.exists():
        lines = [json.loads(line) for line in lag_file.read_text().splitlines()]
        lags = [x for x in lines if "lag_max_s" in x]
        data["profile"] = {"loop_lag_per_s": lags, "snapshots": [x for x in lines if "top" in x][-1:],
                           "gc_gen2": [x for x in lines if "gc_gen2" in x]}
    shutil.rmtree(state, ignore_errors=True)  # (each run's store: ~350 MB at 65,000)
    data["all_completed_once"] = (
        data["all_submitted_came_back"]
        and data["statuses"] == {"completed": setup.rollouts}
        and data["unique_results"] == setup.rollouts
    )
    return data


def _fmt(lat: dict) -> str:
    return f"{lat['p50']:.1f} / {lat['p99']:.1f}"


def _rows(data: dict, rollouts: int) -> list[list]:
    lat, peak = data["latency_ms"], data["latency_at_peak_ms"]
    return [
        ["rollouts admitted / completed", f"{data['admitted']} / {data['statuses'].get('completed', 0)} of {rollouts}"],
        ["unique results (none lost, none twice)", data["unique_results"]],
        ["max in flight (the server's count)", data["max_in_flight"]],
        ["wall seconds", round(data["seconds"], 1)],
        ["server peak RSS (MB)", round(data["peak_rss_mb"], 1)],
        ["  with scoring workers (MB)", round(data["peak_rss_with_scoring_workers_mb"], 1)],
        ["server CPU ms per rollout (process alone)", round(data["server_process_cpu_ms_per_rollout"], 2)],
        ["server CPU ms per rollout (incl. scoring)", round(data["cpu_ms_per_rollout"], 2)],
        ["GET /v1/status p50 / p99 (ms)", _fmt(lat["status"])],
        ["  at >= 90% of max in flight", _fmt(peak["status"])],
        ["GET /v1/rollouts/{id} p50 / p99 (ms)", _fmt(lat["rollout"])],
        ["  at >= 90% of max in flight", _fmt(peak["rollout"])],
        [f"POST /v1/rollouts ({data['rollouts_per_post']} rollouts) p50 / p99 (ms)", _fmt(data["submit_latency_ms"])],
        *([["gate: in flight when the doubles began to answer", data["gate"]["in_flight_at_release"]],
           ["gate: seconds to admit all / from release to the last result",
            f"{data['gate']['admit_s']:.1f} / {data['gate']['release_to_last_result_s']:.1f}"]]
          if "gate" in data else []),
        ["load avg (1 min) before / median / max", f"{data['load_avg_1m_before']:.2f} / "
         f"{data['load_avg_1m_median']:.2f} / {data['load_avg_1m_max']:.2f}"],
    ]


def _ab_rows(runs: dict[str, list[dict]]) -> list[list]:
    """One row per run: the tree, the round, the load, and the measures."""
    rows = []
    for label, datas in runs.items():
        for i, d in enumerate(datas):
            lat = d["latency_ms"]
            rows.append([label, i + 1, round(d["load_avg_1m_before"], 2), d["max_in_flight"],
                         round(d["server_process_cpu_ms_per_rollout"], 2), round(d["cpu_ms_per_rollout"], 2),
                         round(d["peak_rss_mb"], 1), _fmt(lat["status"]), _fmt(lat["rollout"]),
                         _fmt(d["submit_latency_ms"])])
    return rows


def main(setup: Setup, before: Path | None, rounds: int, out: str, before_args: tuple[str, ...] = ()) -> None:
    soft, hard = raise_fd_limit()
    config = {**asdict(setup), "llm_latency_s": setup.latency, "turns_per_rollout": 2,
              "cores": psutil.cpu_count(), "nofile_limit": [soft, hard]}
    title = (f"{setup.rollouts} in-flight math rollouts, test-double LLM at {setup.latency * 1000:.0f} ms/call "
             f"on {setup.ports} port(s)")
    if before is None:
        data = run_once(SRC, setup)
        report(out, title, ["measure", "value"], _rows(data, setup.rollouts), {"config": config, "results": data})
        _check([data])
        return
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    trees = {"before": before, "after": SRC}
    setups = {"before": replace(setup, server_args=setup.server_args + before_args), "after": setup}
    for r in range(rounds):
        for label in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            runs[label].append(run_once(trees[label], setups[label]))
    arms = f"before ({' '.join(before_args)}) vs after" if before_args else "old tree vs new"
    report(out, f"{title}: {arms}, alternated, {rounds} rounds",
           ["tree", "round", "load avg (1 min) before", "max in flight", "server CPU ms/rollout",
            "  with scoring workers", "server peak RSS (MB)", "GET /v1/status p50 / p99 (ms)",
            "GET /v1/rollouts/{id} p50 / p99 (ms)",
            f"POST /v1/rollouts ({setup.tasks_per_post * setup.n}) p50 / p99 (ms)"],
           _ab_rows(runs), {"config": {**config, "before_src": str(before), "before_args": list(before_args),
                                       "rounds": rounds}, "results": runs})
    _check(runs["before"] + runs["after"])


def _check(datas: list[dict]) -> None:
    """Exit non-zero (the JSON written first) unless every run completed each rollout once."""
    failed = [d["statuses"] for d in datas if d["hold_s"] is None and not d["all_completed_once"]]
    if failed:
        sys.exit(f"not every rollout completed exactly once: {failed}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.2, help="the double's seconds per call")
    parser.add_argument("--ports", type=int, default=1, help="test doubles, one backend each")
    parser.add_argument("--n", type=int, default=4, help="samples per task")
    parser.add_argument("--tasks-per-post", type=int, default=50, help="tasks in one POST /v1/rollouts body")
    parser.add_argument("--max-pending", type=int, default=None, help="the server's --max-pending (default: rollouts)")
    parser.add_argument("--max-connections", type=int, default=None, help="each backend's connection pool bound")
    parser.add_argument("--probe-period", type=float, default=0.25, help="seconds between the probe's samples")
    parser.add_argument("--profile", action="store_true", help="loop-lag probe (and tracemalloc) in the server")
    parser.add_argument("--hold", type=float, default=None,
                        help="admit everything, sample this many seconds more, then stop (no results read)")
    parser.add_argument("--backend-timeout", type=float, default=None, help="each backend's seconds per request")
    parser.add_argument("--gate", action="store_true",
                        help="the doubles hold every call until all rollouts are in flight, then answer")
    parser.add_argument("--before", type=Path, default=None, help="the old tree's src folder")
    parser.add_argument("--rounds", type=int, default=2, help="with --before: runs of each tree")
    parser.add_argument("--before-args", default="",
                        help="with --before: more `rollserve serve` options for its server only "
                             "(the same tree with another setting: --before src --before-args '--rollout-slice-ms 0')")
    parser.add_argument("--out", default="concurrency", help="the JSON's name under benchmarks/results")
    args = parser.parse_args()
    if args.before_args and args.before is None:
        parser.error("--before-args needs --before (the tree its server runs: src for this one)")
    main(Setup(args.rollouts, args.latency, args.ports, args.n, args.tasks_per_post, args.max_pending,
               args.max_connections, args.probe_period, args.profile, args.hold,
               args.backend_timeout, gate=args.gate), args.before, args.rounds, args.out,
         tuple(shlex.split(args.before_args)))

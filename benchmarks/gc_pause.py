"""What a full garbage collection costs in `rollserve serve`, with and without
``--gc-freeze`` (``gc.freeze()`` of the start-up's heap once the server has started).

Idle: a server started through the command line as ``rollserve serve`` starts it (its
service, app and engine), then, before and after ``api.serving.freeze_startup_heap``, in
one process: the objects the collector tracks (``gc.get_objects()``) and the wall and CPU
time of ``gc.collect(2)`` (median of ``--repeats``).

In flight: ``benchmarks.concurrency`` with ``--hold`` (``--rollouts`` math rollouts
admitted against a test double that holds every call, none finishing), its server
started with ``--no-gc-freeze``, with ``--gc-freeze``, and with ``--gc-freeze`` and a
young generation of ``--gen0`` objects instead of Python's 700 (``gc.set_threshold``, set
by the benchmark's server wrapper: not a product option) in turn, ``--rounds`` times
each, the order rotating round by round. Its ``--profile`` logs each full collection
(objects walked, CPU, wall) and the event loop's worst lag per second; here, for each
run: the full collections during the run, the last one's objects and time, and the
loop's lag p99 / max.

    python -m benchmarks.gc_pause [--rollouts 4000] [--hold 30] [--rounds 2] [--gen0 50000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import free_port, percentile, report
from benchmarks.concurrency import SRC, Setup, raise_fd_limit, run_once


def _collect_times(repeats: int) -> dict:
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.thread_time()
        gc.collect(2)
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return {"tracked_objects": len(gc.get_objects()), "frozen": gc.get_freeze_count(),
            "collect2_wall_ms": 1000 * statistics.median(walls), "collect2_cpu_ms": 1000 * statistics.median(cpus)}


def idle_child(out: Path, repeats: int, argv: list[str]) -> None:
    """``rollserve serve ARGV`` (without freezing); once started, measure, freeze,
    measure again, write the JSON to ``out`` and stop the server."""
    from rollserve.api import serving

    startup = serving.Server.startup

    async def measured(self: serving.Server, sockets: object = None) -> None:
        await startup(self, sockets)  # type: ignore[arg-type]
        before = _collect_times(repeats)
        frozen = serving.freeze_startup_heap()
        after = _collect_times(repeats)
        out.write_text(json.dumps({"before": before, "after": after, "frozen_by_call": frozen}))
        self.should_exit = True

    serving.Server.startup = measured  # type: ignore[method-assign]
    sys.argv = ["rollserve", *argv]
    from rollserve.cli import main

    main()


def idle(repeats: int) -> dict:
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"rollserve-gc-{os.getpid()}"
    state.mkdir(parents=True, exist_ok=True)
    out = state / "idle.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(SRC.parent)])}
    subprocess.run([sys.executable, "-m", "benchmarks.gc_pause", "--idle-child", str(out), str(repeats),
                    "serve", "--port", str(free_port()), "--state-dir", str(state), "--no-gc-freeze",
                    "--backend", "http://127.0.0.1:9", "--log-level", "warning"],
                   env=env, check=True, timeout=600)
    return json.loads(out.read_text())


def in_flight(data: dict) -> dict:
    """The full collections of one ``--profile --hold`` run, and the loop's lag."""
    profile = data.get("profile", {})
    gen2 = profile.get("gc_gen2", [])
    lags = [1000 * x["lag_max_s"] for x in profile.get("loop_lag_per_s", [])]
    last = gen2[-1] if gen2 else {}
    return {"max_in_flight": data["max_in_flight"], "load_avg_1m_before": data["load_avg_1m_before"],
            "full_collections": len(gen2),
            "full_collections_cpu_s": sum(x["cpu_s"] for x in gen2),
            "young_collections": last.get("young", {}).get("collections"),
            "last_full_objects": last.get("tracked_objects"), "last_full_cpu_ms": 1000 * last.get("cpu_s", 0.0),
            "last_full_wall_ms": 1000 * last.get("wall_s", 0.0),
            "worst_full_wall_ms": max((1000 * x["wall_s"] for x in gen2), default=0.0),
            "loop_lag_p99_ms": percentile(lags, 99), "loop_lag_max_ms": max(lags, default=0.0),
            "server_cpu_ms_per_rollout": data["server_process_cpu_ms_per_rollout"],
            "peak_rss_mb": data["peak_rss_mb"]}


def main(rollouts: int, hold: float, rounds: int, repeats: int, gen0: int, out: str) -> None:
    raise_fd_limit()
    still = idle(repeats)
    # Python's own young threshold (700) for the first two, so they measure the freeze alone: the server's
    # default is now 50,000 (--gc-gen0), set once started.
    modes = {"no freeze": ("--no-gc-freeze", 700), "freeze": ("--gc-freeze", 700),
             f"freeze, gen0 {gen0}": ("--gc-freeze", gen0)}
    runs: dict[str, list[dict]] = {label: [] for label in modes}
    labels = list(modes)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            flag, young = modes[label]
            setup = Setup(rollouts=rollouts, latency=3000.0, tasks_per_post=250, probe_period=0.5, profile=True,
                          hold=hold, backend_timeout=7200.0, server_args=(flag, "--gc-gen0", str(young)))
            runs[label].append(in_flight(run_once(SRC, setup)))
    rows = [["idle, started", label, still[k]["tracked_objects"], "", "", round(still[k]["collect2_cpu_ms"], 1),
             round(still[k]["collect2_wall_ms"], 1), "", "", ""]
            for label, k in (("no freeze", "before"), ("freeze", "after"))]
    for label, datas in runs.items():
        for i, d in enumerate(datas):
            rows.append([f"{d['max_in_flight']} in flight (round {i + 1})", label, d["last_full_objects"],
                         d["full_collections"], round(d["full_collections_cpu_s"], 2),
                         round(d["last_full_cpu_ms"], 1), round(d["last_full_wall_ms"], 1),
                         d["young_collections"], round(d["server_cpu_ms_per_rollout"], 2),
                         round(d["loop_lag_max_ms"], 1)])
    report(out, f"Full garbage collections, idle and with {rollouts} rollouts held in flight ({hold:.0f} s hold)",
           ["server", "gc", "objects walked (last full)", "full collections", "their CPU (s)", "CPU ms (last full)",
            "wall ms (last full)", "young collections", "server CPU ms/rollout", "loop lag max (ms)"], rows,
           {"config": {"rollouts": rollouts, "hold_s": hold, "rounds": rounds, "repeats": repeats, "gen0": gen0},
            "idle": still, "in_flight": runs})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--idle-child":
        idle_child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=4000)
    parser.add_argument("--hold", type=float, default=30.0, help="seconds held after the last submit")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="gc.collect(2) timings per idle measure")
    parser.add_argument("--gen0", type=int, default=50_000, help="the third mode's young generation threshold")
    parser.add_argument("--out", default="gc_pause")
    args = parser.parse_args()
    main(args.rollouts, args.hold, args.rounds, args.repeats, args.gen0, args.out)

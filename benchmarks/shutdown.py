"""Stopping a server that holds many rollouts: SIGTERM to exit, by how many it holds.

For each count in ``--held`` a server (``rollserve serve``, its own process and state)
is given that many math rollouts against the test-double vLLM on ``--ports`` ports at
``--latency`` seconds per call (never answered while it runs), in bodies of
``--tasks-per-post`` tasks (``--n`` samples each), and each backend's connection pool
bounded by ``--max-connections``: once every rollout is in RUN (the server's own count),
its first call sent or waiting for a connection, the server gets SIGTERM. Measured: the
seconds from the signal to the process's exit, and the CPU it spent meanwhile (its
rusage at exit less its CPU at the signal). Checked after each stop: every held rollout
is still unfinished in the store (a restart re-queues it: none lost, none scored), and
none of the server's child processes (the scoring workers) outlived it.

``--before PATH`` (an old tree's ``src``, from ``git archive``) stops a server of that
tree too, at each count, the order alternating count by count, each against its own
test doubles. ``--pyspy DIR`` records each stop with py-spy (raw, 100 Hz) into DIR.

    python -m benchmarks.shutdown [--held 2000,10000,20000] [--before /tmp/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks.common import fake_llm, free_port, report, state_dir, terminate, wait_http
from benchmarks.concurrency import raise_fd_limit

SRC = Path(__file__).resolve().parents[1] / "src"
STOP_LIMIT = 900.0  # seconds a stop may take before the server is killed (and that reported)


@dataclass
class Setup:
    held: tuple[int, ...] = (2000, 10000, 20000)
    latency: float = 3000.0
    ports: int = 2
    n: int = 4
    tasks_per_post: int = 1000
    max_connections: int = 512
    backend_timeout: float = 7200.0
    pyspy: Path | None = None


def _backend(port: int, setup: Setup) -> str:
    return (
        f'{{"url": "http://127.0.0.1:{port}", "max_connections": {setup.max_connections}, '
        f'"timeout": {setup.backend_timeout}}}'
    )


def _submit(url: str, setup: Setup, held: int) -> None:
    timeouts = {"total": 7200.0, "init": 3600.0, "run": 7200.0}
    tasks = [
        {"data_source": "math", "n": setup.n, "instance": {"question": f"What is {i} + {i}?", "answer": str(2 * i)}}
        for i in range(held // setup.n)
    ]
    with httpx.Client(base_url=url, timeout=600) as client:
        for chunk in range(0, len(tasks), setup.tasks_per_post):
            body = {
                "tasks": tasks[chunk : chunk + setup.tasks_per_post],
                "sampling": {"max_tokens": 32},
                "timeouts": timeouts,
            }
            client.post("/v1/rollouts", json=body).raise_for_status()


def _wait_all_in_run(url: str, held: int, server: subprocess.Popen, limit: float = 1800.0) -> dict:
    """Poll ``GET /v1/status`` until all ``held`` rollouts are in RUN (bounded)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        status = httpx.get(f"{url}/v1/status", timeout=120).json()
        if status["live"] == {"run": held}:
            return status
        time.sleep(1.0)
    raise RuntimeError(f"not all {held} rollouts reached RUN in {limit:g}s: {status['live']}")


def _wait_exit(pid: int, limit: float) -> tuple[float, float, bool]:
    """Reap ``pid`` (bounded; killed past ``limit``): (seconds, CPU seconds of its
    whole life, whether it exited by itself)."""
    started = time.perf_counter()
    while True:
        done, _, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, True
        if time.perf_counter() - started > limit:
            os.kill(pid, signal.SIGKILL)
            _, _, usage = os.wait4(pid, 0)
            return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, False
        time.sleep(0.01)


def _outlived(children: list[psutil.Process], grace: float = 10.0) -> list[str]:
    """The server's children still running ``grace`` seconds after it exited (a
    multiprocessing helper sees its parent's pipe close a moment later)."""
    _, alive = psutil.wait_procs(children, timeout=grace)
    return [" ".join(p.cmdline()) or str(p.pid) for p in alive if p.is_running()]


def _during_stop(lag_file: Path, signalled: float) -> dict:
    """From the server's probe: its full collections after the signal, and the loop's
    worst lateness in a second that ended after it."""
    lines = [json.loads(line) for line in lag_file.read_text().splitlines()] if lag_file.exists() else []
    full = [x for x in lines if "gc_gen2" in x and x["t"] >= signalled]
    lags = [x["lag_max_s"] for x in lines if "lag_max_s" in x and x["t"] >= signalled]
    return {
        "full_collections": len(full),
        "full_collections_wall_s": sum(x["wall_s"] for x in full),
        "full_collections_cpu_s": sum(x["cpu_s"] for x in full),
        "full_collection_objects": [x["tracked_objects"] for x in full],
        "loop_lag_max_s": max(lags, default=None),
    }


def _unfinished(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM rollouts GROUP BY status").fetchall())


def hold_and_stop(src: Path, setup: Setup, held: int, label: str) -> dict:
    """One server of the tree at ``src``: hold ``held`` rollouts in RUN, then stop it."""
    llm_ports, api_port = [free_port() for _ in range(setup.ports)], free_port()
    state = Path(state_dir("rollserve-bench-stop-"))
    fakes = [fake_llm(p, setup.latency, "Let me think about it.", "So \\boxed{2}.") for p in llm_ports]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(SRC.parent)])}
    lag_file = state / "loop_lag.jsonl"  # (the loop's lag and each full collection: benchmarks.concurrency_probe)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.concurrency_probe",
            str(lag_file),
            "serve",
            "--port",
            str(api_port),
            "--state-dir",
            str(state),
            *[a for p in llm_ports for a in ("--backend", _backend(p, setup))],
            "--init-workers",
            str(held),
            "--run-workers",
            str(held),
            "--eval-workers",
            "64",
            "--max-pending",
            str(held),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    spy = None
    try:
        for port, fake in zip(llm_ports, fakes, strict=True):
            wait_http(f"http://127.0.0.1:{port}/health", fake, timeout=600)
        url = f"http://127.0.0.1:{api_port}"
        wait_http(f"{url}/healthz", server, timeout=600)
        _submit(url, setup, held)
        status = _wait_all_in_run(url, held, server)
        proc = psutil.Process(server.pid)
        children = proc.children(recursive=True)
        rss_mb = proc.memory_info().rss / 2**20
        if setup.pyspy is not None:
            setup.pyspy.mkdir(parents=True, exist_ok=True)
            out = setup.pyspy / f"stop_{label}_{held}.txt"
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-r",
                    "100",
                    "--format",
                    "raw",
                    "-p",
                    str(server.pid),
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
            )
            time.sleep(2.0)  # (py-spy attaches)
        times = proc.cpu_times()
        cpu_before = times.user + times.system
        load = os.getloadavg()[0]
        signalled = time.time()
        server.send_signal(signal.SIGTERM)
        seconds, cpu_life, exited = _wait_exit(server.pid, STOP_LIMIT)
        server.returncode = 0  # (reaped above)
        outlived = _outlived(children)
        rows = _unfinished(state / "rollserve.db")
    finally:
        if server.returncode is None:
            server.kill()
            server.wait(timeout=60)
        if spy is not None:
            spy.wait(timeout=120)
        terminate(*fakes)
    return {
        **_during_stop(lag_file, signalled),
        "tree": label,
        "held": held,
        "stop_s": seconds,
        "stop_cpu_s": cpu_life - cpu_before,
        "exited_by_itself": exited,
        "rss_mb_before_stop": rss_mb,
        "load_avg_1m_at_stop": load,
        "stages_at_stop": status["stages"],
        "store_after_stop": rows,
        "none_lost": rows == {"run": held},
        "children_outlived": outlived,
    }


def main(setup: Setup, before: Path | None) -> None:
    soft, hard = raise_fd_limit()
    trees = {"new": SRC} if before is None else {"old": before, "new": SRC}
    runs = []
    for i, held in enumerate(setup.held):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for label in order:
            runs.append(hold_and_stop(trees[label], setup, held, label))
            print(runs[-1], flush=True)
    rows = [
        [
            r["tree"],
            r["held"],
            round(r["stop_s"], 2),
            round(r["stop_cpu_s"], 2),
            r["full_collections"],
            round(r["full_collections_wall_s"], 2),
            r["exited_by_itself"],
            r["none_lost"],
            len(r["children_outlived"]),
            round(r["load_avg_1m_at_stop"], 2),
        ]
        for r in runs
    ]
    config = {
        **asdict(setup),
        "pyspy": str(setup.pyspy) if setup.pyspy else None,
        "before_src": str(before),
        "cores": psutil.cpu_count(),
        "nofile_limit": [soft, hard],
    }
    report(
        "shutdown",
        f"SIGTERM to exit of a server holding N math rollouts in RUN "
        f"({setup.ports} double(s) at {setup.latency:g} s/call, {setup.max_connections} connections each)",
        [
            "tree",
            "held",
            "stop (s)",
            "stop CPU (s)",
            "full collections",
            "their wall (s)",
            "exited by itself",
            "none lost",
            "children outlived",
            "load avg (1 min)",
        ],
        rows,
        {"config": config, "results": runs},
    )
    bad = [r for r in runs if not (r["exited_by_itself"] and r["none_lost"] and not r["children_outlived"])]
    if bad:
        sys.exit(f"a stop lost rollouts, left processes or did not end: {bad}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--held", default="2000,10000,20000", help="rollouts held at the stop, comma-separated")
    parser.add_argument("--latency", type=float, default=3000.0, help="the double's seconds per call")
    parser.add_argument("--ports", type=int, default=2, help="test doubles, one backend each")
    parser.add_argument("--n", type=int, default=4, help="samples per task")
    parser.add_argument("--tasks-per-post", type=int, default=1000, help="tasks in one POST /v1/rollouts body")
    parser.add_argument("--max-connections", type=int, default=512, help="each backend's connection pool bound")
    parser.add_argument("--before", type=Path, default=None, help="the old tree's src folder")
    parser.add_argument("--pyspy", type=Path, default=None, help="record each stop with py-spy into this folder")
    args = parser.parse_args()
    main(
        Setup(
            held=tuple(int(x) for x in args.held.split(",")),
            latency=args.latency,
            ports=args.ports,
            n=args.n,
            tasks_per_post=args.tasks_per_post,
            max_connections=args.max_connections,
            pyspy=args.pyspy and args.pyspy.resolve(),
        ),
        args.before,
    )

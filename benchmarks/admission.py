"""The admission path alone: ``POST /v1/rollouts`` of big bodies to a server whose
test-double LLM never answers in time, with rollouts piling up in flight.

The server runs as its own process (``rollserve serve``) against the test-double vLLM
at ``--latency`` seconds per call (default an hour: every admitted rollout stays in
flight, waiting on its first call, so nothing but admission and holding runs). This
script posts ``--posts`` bodies of ``--tasks-per-post`` math tasks (``n=1``) one after
the other and, for each, records its wall time and the server process's CPU seconds
across it (psutil, before and after: the robust measure on a shared machine). A probe
task asks ``GET /v1/status`` and ``GET /v1/rollouts/{id}`` (an admitted id) every
``--probe-period`` seconds throughout, on its own connection. Reports p50/p99 of each,
CPU ms per POST and per rollout, and the load average.

``--before PATH`` (an old tree's ``src``, from ``git archive``) runs a server of that
tree and one of this tree in turn, ``--rounds`` times each, alternating the order.
``--run-workers 1`` leaves one RUN slot: every other rollout waits for it after INIT,
and no prompt is built and no call is sent, so what the server spends across a POST is
admission's own (with the default, every rollout also starts its first LLM call).
``--py-spy BIN`` records the server (raw folded stacks, 200 Hz) during the posts of
each run into ``<out>_<tree>_<round>.folded`` under ``$TMPDIR/rollserve-admission``.

    python -m benchmarks.admission [--posts 20] [--tasks-per-post 1000]
    python -m benchmarks.admission --before /tmp/old-admit/src --rounds 2 --out admission_ab
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks.common import fake_llm, free_port, median, percentile, report, terminate, wait_http

SRC = Path(__file__).resolve().parents[1] / "src"
PROFILES = Path(tempfile.gettempdir()) / "rollserve-admission"


@dataclass
class Setup:
    posts: int = 20
    tasks_per_post: int = 1000
    latency: float = 3600.0
    probe_period: float = 0.05
    py_spy: str | None = None
    run_workers: int | None = None


def _ms(values: list[float]) -> dict:
    return {"p50": 1000 * median(values), "p99": 1000 * percentile(values, 99),
            "max": 1000 * max(values, default=float("nan")), "n": len(values)}


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def _probe(url: str, ids: list[str], period: float, stop: asyncio.Event, out: dict[str, list[float]]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            (await client.get("/v1/status")).raise_for_status()
            out["status"].append(time.perf_counter() - t0)
            if ids:
                t0 = time.perf_counter()
                (await client.get(f"/v1/rollouts/{random.choice(ids)}")).raise_for_status()
                out["rollout"].append(time.perf_counter() - t0)
            try:
                await asyncio.wait_for(stop.wait(), period)
            except TimeoutError:
                pass


async def _post_all(url: str, setup: Setup, server: psutil.Process) -> dict:
    ids: list[str] = []
    lat: dict[str, list[float]] = {"status": [], "rollout": []}
    walls, cpus = [], []
    stop = asyncio.Event()
    timeouts = {"total": 7200.0, "init": 3600.0, "run": 7200.0}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        probing = asyncio.create_task(_probe(url, ids, setup.probe_period, stop, lat))
        try:
            for p in range(setup.posts):
                tasks = [{"data_source": "math", "n": 1,
                          "instance": {"question": f"What is {p} + {i}?", "answer": str(p + i)}}
                         for i in range(setup.tasks_per_post)]
                body = {"tasks": tasks, "sampling": {"max_tokens": 32}, "timeouts": timeouts}
                cpu0, t0 = _cpu(server), time.perf_counter()
                response = await client.post("/v1/rollouts", json=body)
                walls.append(time.perf_counter() - t0)
                cpus.append(_cpu(server) - cpu0)
                response.raise_for_status()
                ids.extend(r for g in response.json()["groups"] for r in g["rollout_ids"])
        finally:
            stop.set()
            await probing
        status = (await client.get("/v1/status")).json()
    return {"admitted": len(ids), "in_flight_at_end": status.get("in_flight"),
            "post_ms": _ms(walls), "post_cpu_ms": _ms(cpus),
            "cpu_ms_per_rollout": 1000 * sum(cpus) / max(1, len(ids)),
            "status_ms": _ms(lat["status"]), "rollout_ms": _ms(lat["rollout"])}


def run_once(src: Path, setup: Setup, profile: Path | None) -> dict:
    llm_port, api_port = free_port(), free_port()
    state = tempfile.mkdtemp(prefix="rollserve-admit-")
    fake = fake_llm(llm_port, setup.latency, "So \\boxed{2}.")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(SRC.parent)])}
    limit = str(setup.posts * setup.tasks_per_post)
    backend = json.dumps({"url": f"http://127.0.0.1:{llm_port}", "timeout": 2 * setup.latency})
    server = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(api_port), "--state-dir", state,
         "--backend", backend, "--init-workers", limit, "--run-workers", str(setup.run_workers or limit),
         "--max-pending", limit, "--log-level", "warning"], env=env)
    spy = None
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/health", fake, timeout=600)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server, timeout=600)
        if setup.py_spy and profile is not None:
            profile.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen([setup.py_spy, "record", "-r", "200", "--format", "raw", "-o", str(profile),
                                    "-p", str(server.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # (py-spy attaches before the first post)
        load = os.getloadavg()[0]
        data = asyncio.run(_post_all(f"http://127.0.0.1:{api_port}", setup, psutil.Process(server.pid)))
        data["load_avg_1m_before"], data["load_avg_1m_after"] = load, os.getloadavg()[0]
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=120)
        terminate(server, fake, timeout=300)
    return data


def _row(label: str, i: int, d: dict) -> list:
    def fmt(x: dict) -> str:
        return f"{x['p50']:.1f} / {x['p99']:.1f}"

    return [label, i + 1, f"{d['load_avg_1m_before']:.2f} / {d['load_avg_1m_after']:.2f}", d["admitted"],
            fmt(d["post_ms"]), fmt(d["post_cpu_ms"]), round(d["cpu_ms_per_rollout"], 3),
            fmt(d["status_ms"]), fmt(d["rollout_ms"])]


def main(setup: Setup, before: Path | None, rounds: int, out: str) -> None:
    trees = {"after": SRC} if before is None else {"before": before, "after": SRC}
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for label in order:
            profile = PROFILES / f"{out}_{label}_{r + 1}.folded" if setup.py_spy else None
            runs[label].append(run_once(trees[label], setup, profile))
    rows = [_row(label, i, d) for label, datas in runs.items() for i, d in enumerate(datas)]
    title = (f"POST /v1/rollouts of {setup.tasks_per_post} tasks, {setup.posts} posts in a row, "
             "every rollout held in flight (the LLM double never answers in time)")
    report(out, title, ["tree", "round", "load avg before / after", "admitted",
                        "POST p50 / p99 (ms)", "server CPU per POST p50 / p99 (ms)", "CPU ms per rollout",
                        "GET /v1/status p50 / p99 (ms)", "GET /v1/rollouts/{id} p50 / p99 (ms)"],
           rows, {"config": {**asdict(setup), "rounds": rounds, "before_src": str(before) if before else None,
                             "cores": psutil.cpu_count()}, "results": runs})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--posts", type=int, default=20)
    parser.add_argument("--tasks-per-post", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=3600.0, help="the double's seconds per call")
    parser.add_argument("--probe-period", type=float, default=0.05)
    parser.add_argument("--py-spy", default=None, help="the py-spy binary: profile each server")
    parser.add_argument("--run-workers", type=int, default=None,
                        help="the server's RUN slots (default: every rollout's); 1: all but one rollout wait "
                        "for RUN after INIT, no LLM call is made: the CPU measured is admission's alone")
    parser.add_argument("--before", type=Path, default=None, help="the old tree's src folder")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default="admission")
    args = parser.parse_args()
    main(Setup(args.posts, args.tasks_per_post, args.latency, args.probe_period, args.py_spy, args.run_workers),
         args.before, args.rounds, args.out)

"""Soak: ``--minutes`` of steady mixed load on one server, its process tree sampled
every ``--sample-every`` seconds, looking for growth (a leak) and for anything lost or
left behind.

`rollserve serve` runs as its own process (bubblewrap sandboxes, results kept
``--retention-minutes``), the test-double vLLM as another (``--latency`` s per call,
the scripted policy of ``benchmarks/soak_policy.py``). This script is the trainer:
it keeps ``--math`` math rollouts, ``--code`` sandboxed code rollouts (editor, bash,
submit; hidden tests at EVAL) and ``--gateway`` gateway-harness rollouts (the
``command`` preset: a script in the sandbox calling the recording gateway twice) in
flight, submitting one as each ends; streams every result by cursor; polls
``GET /v1/status`` and a recent ``GET /v1/rollouts/{id}``; cancels ``--cancel`` of
the rollouts (a code one while its bash sleeps in the sandbox, a gateway one while its
script sleeps); and every ``--restart-every`` minutes kills the backend (SIGKILL) and
starts it again ``--down`` s later on the same port, so rollouts see it fail.

Sampled: the server's RSS (and its tree's), open fds, threads, child processes,
bubblewrap processes, its sandboxes' owner records, open sandboxes (its status) and
the state folder's size. Growth of each: the mean of the last ``--window`` minutes
against the mean of the ``--window`` minutes from ``--warmup`` on. At the end: every
submitted rollout comes back exactly once in the results stream with a terminal
status (a failure with its stage and kind), and after the server's shutdown no process
it ever had, no owner record and no sandbox folder is left.

    python -m benchmarks.soak [--minutes 30] [--math 8] [--code 3] [--gateway 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from benchmarks.common import RESULTS, free_port, percentile, report, wait_http
from benchmarks.soak_sampling import Sampler, growth, leftovers, plot

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
CALL = """
import json, os, sys, time, urllib.request
tag = open(os.environ["ROLLSERVE_TASK_FILE"]).read().strip()
if "slow" in tag:
    time.sleep(30)
for turn in range(2):
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": f"{tag} turn {turn}"}]})
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(json.loads(answer.read())["choices"][0]["message"]["content"], flush=True)
"""


class Backend:
    """The test-double vLLM as a process on a fixed port: killed and restarted."""

    def __init__(self, port: int, latency: float):
        self.port, self.latency = port, latency
        self.proc: subprocess.Popen | None = None
        self.restarts: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollserve.testing.fake_vllm", "--port", str(self.port),
             "--latency", str(self.latency), "--script", str(ROOT / "benchmarks" / "soak_policy.py")],
            stdout=subprocess.DEVNULL, env=ENV)
        try:
            wait_http(f"{self.url}/health", self.proc)
        except BaseException:  # never ready: not left running
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    async def restart(self, t: float, down: float) -> None:
        self.kill()
        await asyncio.sleep(down)
        await asyncio.to_thread(self.start)
        self.restarts.append({"t": t, "down_s": down})


def task(kind: str, n: int, slow: bool) -> dict:
    mode = " slow" if slow else ""
    if kind == "math":
        from rollserve.datasets import bundled_rows

        rows = [row for row in bundled_rows("math") if "question" in row]  # as the policy's
        row = rows[n % len(rows)]
        return {"data_source": "math", "instance": {"question": f"[soak math {n % len(rows)}] {row['question']}",
                                                    "answer": row["answer"]}}
    if kind == "code":
        from rollserve.datasets import bundled_rows

        rows = bundled_rows("code")
        row = {k: v for k, v in rows[n % len(rows)].items() if k != "task_id"}
        row["problem"] = f"[soak code {rows[n % len(rows)]['task_id']}{mode}] {row['problem']}"
        return {"data_source": "code", "instance": row}
    answer = str(n % 1000)
    return {"data_source": "gateway", "instance": {
        "answer": answer, "task": f"[soak gw {answer}{mode}]", "files": {"call.py": CALL},
        "harness": {"preset": "command", "command": '"$ROLLSERVE_PYTHON" call.py'}}}


class Trainer:
    """The load: slots per kind, a results stream, a poller; what each rollout did."""

    def __init__(self, api: httpx.AsyncClient, args: argparse.Namespace, t0: float):
        self.api, self.args, self.t0 = api, args, t0
        self.stop = asyncio.Event()
        self.submitted: dict[str, dict] = {}  # id -> kind, cancel asked, final view
        self.streamed: list[dict] = []
        self.latency: dict[str, list[float]] = {"submit": [], "status": [], "rollout": [], "cancel": []}
        self.count = 0
        self.final_status: dict = {}
        self.rng = random.Random(25)

    async def _timed(self, name: str, call) -> httpx.Response:
        t = time.perf_counter()
        r = await call
        self.latency[name].append(time.perf_counter() - t)
        return r

    async def slot(self, kind: str) -> None:
        while not self.stop.is_set():
            self.count += 1
            cancel = self.rng.random() < self.args.cancel
            body = {"tasks": [task(kind, self.count, slow=cancel and kind != "math")],
                    "sampling": {"max_tokens": 512}, "agent": {"max_turns": 4}}
            r = await self._timed("submit", self.api.post("/v1/rollouts", json=body))
            r.raise_for_status()
            (rid,) = r.json()["groups"][0]["rollout_ids"]
            record = self.submitted[rid] = {"kind": kind, "cancel": cancel, "t": time.monotonic() - self.t0}
            if cancel:
                await asyncio.sleep(self.rng.uniform(0.0, 0.5) if kind == "math" else self.rng.uniform(2.0, 6.0))
                r = await self._timed("cancel", self.api.delete(f"/v1/rollouts/{rid}"))
                record["cancel_answer"] = r.status_code
            record["view"] = await self.wait_done(rid)

    async def wait_done(self, rid: str) -> dict:
        for _ in range(60):  # bounded: 60 x 30 s
            r = await self.api.get(f"/v1/rollouts/{rid}", params={"wait": 30})
            r.raise_for_status()
            view = r.json()
            if view["done"]:
                result = view["result"]
                return {"status": result["status"], "mask": result["mask"], "reward": result["reward"],
                        "failure": result["failure"]}
        return {"status": "not done after 30 min"}

    async def stream(self) -> None:
        cursor = 0
        while True:
            r = await self.api.get("/v1/results", params={"after": cursor, "limit": 500, "wait": 2})
            r.raise_for_status()
            page = r.json()
            self.streamed += [{"id": x["id"], "status": x["status"]} for x in page["results"]]
            cursor = page["next"]
            if self.stop.is_set() and not page["results"] and self._all_back():
                return

    def _all_back(self) -> bool:
        return len({x["id"] for x in self.streamed}) >= len(self.submitted)

    async def poll(self) -> None:
        while not self.stop.is_set():
            await self._timed("status", self.api.get("/v1/status"))
            if self.submitted:
                rid = list(self.submitted)[-1 - self.rng.randrange(min(50, len(self.submitted)))]
                await self._timed("rollout", self.api.get(f"/v1/rollouts/{rid}"))
            await asyncio.sleep(0.5)


async def drive(args: argparse.Namespace, api_url: str, backend: Backend, sampler: Sampler) -> Trainer:
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=api_url, timeout=120) as api:
        trainer = Trainer(api, args, t0)
        sampler.api = api
        slots = [asyncio.create_task(trainer.slot(kind))
                 for kind, n in (("math", args.math), ("code", args.code), ("gateway", args.gateway))
                 for _ in range(n)]
        others = [asyncio.create_task(trainer.stream()), asyncio.create_task(trainer.poll())]
        sampling = asyncio.create_task(sampler.run(t0, args.sample_every))
        end = t0 + 60 * args.minutes
        every = 60 * min(args.restart_every, args.minutes / 2)
        next_restart = t0 + every
        while time.monotonic() < end:
            await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if time.monotonic() >= next_restart and end - time.monotonic() > min(60.0, every / 2):
                await backend.restart(time.monotonic() - t0, args.down)
                next_restart += every
            if any(s.done() and s.exception() for s in slots + others):
                break
        trainer.stop.set()
        await asyncio.wait_for(asyncio.gather(*slots, *others), timeout=1800)
        await sampler.once(time.monotonic() - t0)  # after the drain
        sampling.cancel()
        status = (await api.get("/v1/status")).json()
        trainer.final_status = {"llm": {k: status["llm"][k] for k in ("calls", "retries", "failed", "moves")},
                                "finished": status["finished"], "sandboxes_started": status["sandboxes"]["started"],
                                "sandboxes_open": status["sandboxes"]["open"], "in_flight": status["in_flight"]}
    return trainer


def accounting(trainer: Trainer) -> dict:
    streamed = Counter(x["id"] for x in trainer.streamed)
    views = {rid: rec.get("view", {}) for rid, rec in trainer.submitted.items()}
    by_kind: dict[str, Counter] = {}
    failures: Counter = Counter()
    untyped = 0
    for rid, rec in trainer.submitted.items():
        status = views[rid].get("status", "no answer")
        by_kind.setdefault(rec["kind"], Counter())[status] += 1
        failure = views[rid].get("failure")
        if status != "completed":
            if status != "cancelled" and not failure:
                untyped += 1
            if failure:
                failures[f"{rec['kind']} {status} {failure['stage']}/{failure['kind']}"] += 1
    cancel_asked = [rec for rec in trainer.submitted.values() if rec["cancel"]]
    return {
        "submitted": len(trainer.submitted),
        "streamed_once": sum(1 for rid in trainer.submitted if streamed[rid] == 1),
        "streamed_twice": sum(1 for n in streamed.values() if n > 1),
        "lost": sum(1 for rid in trainer.submitted if streamed[rid] == 0),
        "streamed_unknown": sum(1 for rid in streamed if rid not in trainer.submitted),
        "by_kind": {k: dict(v) for k, v in by_kind.items()},
        "failures": dict(failures),
        "terminal_without_failure": untyped,
        "cancel_asked": len(cancel_asked),
        "cancel_ended_cancelled": sum(1 for rec in cancel_asked if rec.get("view", {}).get("status") == "cancelled"),
    }


def serve(args: argparse.Namespace, port: int, backend: Backend, state: Path) -> subprocess.Popen:
    probe = (["-m", "benchmarks.soak_trace", args.trace, "--at", args.trace_at, "--"] if args.trace
             else ["-m", "rollserve.cli"])
    return subprocess.Popen(
        [sys.executable, *probe, "serve", "--port", str(port), "--state-dir", str(state),
         "--backend", backend.url, "--retention-hours", str(args.retention_minutes / 60),
         "--log-level", "warning"], env=ENV)


def main(args: argparse.Namespace) -> None:
    state = Path(tempfile.mkdtemp(prefix="rollserve-soak-"))
    backend = Backend(free_port(), args.latency)
    backend.start()
    port = free_port()
    server = serve(args, port, backend, state)
    sampler = Sampler(psutil.Process(server.pid), state)
    load = [os.getloadavg()[0]]
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", server)
        trainer = asyncio.run(drive(args, f"http://127.0.0.1:{port}", backend, sampler))
        load.append(os.getloadavg()[0])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        finally:
            if server.poll() is None:
                server.kill()
            backend.kill()
    left = leftovers(sampler, state)
    counts = accounting(trainer)
    grow = growth(sampler.samples, args.warmup, args.window)
    plot(sampler.samples, backend.restarts, args.warmup, RESULTS / f"{args.out}.png",
         f"soak: {args.minutes:g} min, {args.math} math + {args.code} code + {args.gateway} gateway in flight")
    lat = {k: {"p50": 1000 * percentile(v, 50), "p99": 1000 * percentile(v, 99), "n": len(v)}
           for k, v in trainer.latency.items()}
    rows = [[name, g["start"], g["end"], f"{100 * g['growth']:+.1f}%", g["trend_per_hour"], g["max"]]
            for name, g in grow.items()]
    report(args.out, f"soak: {args.minutes:g} minutes; growth from minute {args.warmup:g} to the end",
           ["measure", f"mean, minutes {args.warmup:g}-{args.warmup + args.window:g}", "mean, last "
            f"{args.window:g} min", "growth", "trend per hour", "max"], rows,
           {"config": {k: v for k, v in vars(args).items()}, "cores": psutil.cpu_count(),
            "load_avg_1m_start_end": load, "backend_restarts": backend.restarts,
            "accounting": counts, "leftovers_after_shutdown": left, "growth": grow,
            "server_status_after_drain": trainer.final_status, "server_exit_code": server.returncode,
            "latency_ms": lat, "samples": sampler.samples})
    print({"accounting": counts, "leftovers": left, "status": trainer.final_status})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before growth is measured")
    parser.add_argument("--window", type=float, default=2.0, help="minutes averaged at each end")
    parser.add_argument("--math", type=int, default=8, help="math rollouts kept in flight")
    parser.add_argument("--code", type=int, default=3, help="code rollouts kept in flight")
    parser.add_argument("--gateway", type=int, default=3, help="gateway-harness rollouts kept in flight")
    parser.add_argument("--latency", type=float, default=0.2, help="backend seconds per call")
    parser.add_argument("--cancel", type=float, default=0.1, help="share of rollouts cancelled")
    parser.add_argument("--restart-every", type=float, default=10.0, help="minutes between backend kills")
    parser.add_argument("--down", type=float, default=20.0, help="seconds the backend stays down")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--retention-minutes", type=float, default=2.0,
                        help="the server keeps results this long (under --warmup: the store is full by then)")
    parser.add_argument("--trace", default="", help="a folder: run the server under benchmarks/soak_trace.py "
                        "(tracemalloc, gc type counts, smaps) probing at --trace-at seconds")
    parser.add_argument("--trace-at", default="300,900", help="seconds after the server's start to probe at")
    parser.add_argument("--out", default="soak", help="the JSON's and PNG's name under benchmarks/results")
    main(parser.parse_args())

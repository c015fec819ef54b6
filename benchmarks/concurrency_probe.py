"""What ``benchmarks.concurrency`` measures from outside the trainer's process.

``probe`` runs in its own process (the trainer's loop validates pages of results, which
would hold the GIL and delay a thread's requests): every ``period`` seconds it asks
``GET /v1/status`` (its latency, and the server's own ``in_flight`` count) and
``GET /v1/rollouts/{id}`` of a random rollout submitted so far (its latency), and reads
the server's RSS, with and without its children, and the load average. Each sample is
``(t, kind, value, in_flight)``; the samples (and the status answered at the most in
flight) go back on a queue when told to stop.

``serve_probed`` (``python -m benchmarks.concurrency_probe SNAPSHOT_DIR serve ...``) is
``rollserve serve`` with measuring aids the product does not carry: a loop-lag probe
(a task that sleeps 50 ms and records how late it woke, the longest lateness per
second), each full garbage collection's wall and CPU time and, with
``ROLLSERVE_BENCH_TRACEMALLOC=1``, tracemalloc snapshots at the first submit and when
the most rollouts are in flight, diffed by line and divided by that count: the bytes
each in-flight rollout holds, and where.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import tracemalloc
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx
import psutil

LAG_PERIOD = 0.05  # seconds the loop-lag probe sleeps


def _rss(proc: psutil.Process) -> tuple[int, int]:
    own = tree = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            rss = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        tree += rss
        own = own or rss
    return own, tree


def _schedstat(pid: int) -> tuple[float, float] | None:
    """Seconds the process's main thread (the event loop's) has run on a CPU, and has
    waited runnable for one (``/proc/PID/schedstat``), or None where unreadable."""
    try:
        run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(run) / 1e9, int(wait) / 1e9


def probe(url: str, pid: int, ids: Queue, stop: Event, out: Queue, period: float) -> None:
    """Sample until ``stop`` is set, then put the samples on ``out``."""
    server = psutil.Process(pid)
    known: list[str] = []
    samples: list[tuple[float, str, float, int]] = []
    started = time.monotonic()
    in_flight = 0
    peak: dict = {}  # the status answered at the most in flight
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            tick = time.monotonic()
            while not ids.empty():
                known += ids.get_nowait()
            t0 = time.perf_counter()
            status = client.get("/v1/status")
            lat = time.perf_counter() - t0
            if status.status_code == 200:
                body = status.json()
                in_flight = body["in_flight"]
                samples.append((tick - started, "status", lat, in_flight))
                if in_flight >= peak.get("in_flight", 0):
                    peak = {"in_flight": in_flight, "live": body["live"], "backends": body["backends"],
                            "stages": body["stages"], "t": tick - started}
            if known:
                t0 = time.perf_counter()
                got = client.get(f"/v1/rollouts/{random.choice(known)}")
                if got.status_code == 200:
                    samples.append((tick - started, "rollout", time.perf_counter() - t0, in_flight))
            sched = _schedstat(pid)
            if sched is not None:  # the loop's thread: on a CPU, and runnable but waiting for one
                samples.append((tick - started, "loop_cpu_s", sched[0], in_flight))
                samples.append((tick - started, "loop_runqueue_s", sched[1], in_flight))
            own, tree = _rss(server)
            samples.append((tick - started, "rss", own, in_flight))
            samples.append((tick - started, "tree_rss", tree, in_flight))
            samples.append((tick - started, "load", os.getloadavg()[0], in_flight))
            stop.wait(max(0.0, period - (time.monotonic() - tick)))
    out.put((samples, peak))


# --- the server with its measuring aids ---------------------------------------------


def _top_diff(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, count: int) -> list[dict]:
    stats = after.compare_to(before, "lineno")
    return [
        {"where": f"{s.traceback[0].filename.split('site-packages/')[-1].split('src/')[-1]}:{s.traceback[0].lineno}",
         "bytes": s.size_diff, "blocks": s.count_diff}
        for s in stats[:count]
    ]


async def _lag_probe(engine: object, out: Path) -> None:
    """Every 50 ms: how late the loop woke; each second the worst, with the count in
    flight; with tracemalloc, the snapshots. Written to ``out`` as JSON lines."""
    loop = asyncio.get_running_loop()
    tracing = tracemalloc.is_tracing()
    base: tracemalloc.Snapshot | None = None
    peak = 0
    worst, second = 0.0, loop.time()
    with out.open("a") as log:
        while True:
            t0 = loop.time()
            await asyncio.sleep(LAG_PERIOD)
            worst = max(worst, loop.time() - t0 - LAG_PERIOD)
            pending = engine.pending  # type: ignore[attr-defined]
            if tracing and base is None and pending > 0:
                base = tracemalloc.take_snapshot()
            if tracing and base is not None and pending > max(peak * 1.1, 100):
                peak = pending
                snap = tracemalloc.take_snapshot()
                total = sum(s.size_diff for s in snap.compare_to(base, "filename"))
                log.write(json.dumps({"snapshot_in_flight": pending, "bytes_per_rollout": total / pending,
                                      "top": _top_diff(base, snap, 30)}) + "\n")
            if loop.time() - second >= 1.0:
                log.write(json.dumps({"t": time.time(), "lag_max_s": worst, "in_flight": pending}) + "\n")
                log.flush()
                worst, second = 0.0, loop.time()


def _watch_gc(out: Path) -> None:
    """Log each full (generation 2) garbage collection: its wall and CPU seconds and the
    objects it walked, as a JSON line in ``out``; the time of the others, summed."""
    started: dict[str, float] = {}
    young = {"collections": 0, "wall_s": 0.0}

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started["wall"], started["cpu"] = time.perf_counter(), time.thread_time()
            return
        wall = time.perf_counter() - started.get("wall", time.perf_counter())
        if info["generation"] < 2:
            young["collections"] += 1
            young["wall_s"] += wall
            return
        import gc

        with out.open("a") as log:
            log.write(json.dumps({"gc_gen2": True, "t": time.time(), "wall_s": wall,
                                  "cpu_s": time.thread_time() - started.get("cpu", 0.0),
                                  "tracked_objects": len(gc.get_objects(2)), "young": dict(young)}) + "\n")

    import gc

    gc.callbacks.append(callback)


def serve_probed(out: Path, argv: list[str]) -> None:
    if os.environ.get("ROLLSERVE_BENCH_TRACEMALLOC") == "1":
        tracemalloc.start(1)
    _watch_gc(out)
    from rollserve.engine.pipeline import Engine

    start = Engine.start

    async def start_probed(self: Engine):  # type: ignore[no-untyped-def]
        recovered = await start(self)
        self._bench_probe = asyncio.create_task(_lag_probe(self, out))  # type: ignore[attr-defined]
        return recovered

    Engine.start = start_probed  # type: ignore[method-assign]
    sys.argv = ["rollserve", *argv]
    from rollserve.cli import main

    main()


if __name__ == "__main__":
    serve_probed(Path(sys.argv[1]), sys.argv[2:])

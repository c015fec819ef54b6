"""Throughput against the number of Ray nodes, on a workload bound by waiting.

A `ray.cluster_utils.Cluster` on this machine: a head without rollserve slots and
three worker nodes of 16 slots each; `rollserve serve --ray` as its own process; the
test-double vLLM as another (each call waits --latency seconds; two turns per
episode), so a rollout is about 2 x latency of waiting and little CPU. For 1, 2 and 3
nodes (the others drained: `POST /v1/nodes/{name}/drain`) a batch of 96 x nodes math
rollouts runs; the stage pools are far larger than the slots, so the nodes' slots are
the limit. Reports rollouts/s per node count, the speed-up over one node, and the
head's CPU per rollout (the `rollserve serve` process only: the nodes' workers are
Ray's processes).

    python -m benchmarks.ray_scaling [--latency 1.5] [--per-node 96]

Writes results/ray_scaling.json at the default latency, results/ray_scaling_latency<ms>ms.json
at any other.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from ray.cluster_utils import Cluster

from benchmarks.common import fake_llm, free_port, report, wait_http
from rollserve.client import Client
from rollserve.contract import RolloutResult

SLOTS = 16
NODES = 3
DEFAULT_LATENCY = 1.5  # seconds per LLM call (docs/benchmarks.md's table; others get their own file)


def run_batch(url: str, count: int, head: psutil.Process) -> dict:
    tasks = [{"data_source": "math", "instance": {"question": f"What is {i} + {i}?",
                                                  "answer": str(2 * i)}} for i in range(count)]
    with Client(url, timeout=120) as client:
        before = httpx.get(f"{url}/v1/status", timeout=30).json()["last_seq"]
        cpu = sum(head.cpu_times()[:2])
        started = time.perf_counter()
        accepted = client.submit(tasks, sampling={"max_tokens": 32})
        results: list[RolloutResult] = []
        cursor = before
        while len(results) < count:
            page = client.results(after=cursor, limit=1000, wait=5)
            results += page.results
            cursor = page.next
        elapsed = time.perf_counter() - started
        cpu = sum(head.cpu_times()[:2]) - cpu
    ids = {rid for g in accepted.groups for rid in g.rollout_ids}
    result_bytes = [len(r.model_dump_json()) for r in results]
    return {"rollouts": count, "seconds": elapsed, "rollouts_per_s": count / elapsed,
            "completed": sum(r.status == "completed" for r in results),
            "none_lost_none_twice": {r.id for r in results} == ids and len(results) == count,
            "head_cpu_ms_per_rollout": 1000 * cpu / count,
            "result_json_bytes_mean": sum(result_bytes) / len(result_bytes)}


def main(latency: float, per_node: int) -> None:
    src = str(Path(__file__).resolve().parents[1] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    node = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    fake = server = None
    try:
        for i in range(NODES):
            cluster.add_node(**node, resources={"rollserve": SLOTS}, labels={"rollserve-node": f"node{i}"})
        llm_port, api_port = free_port(), free_port()
        url = f"http://127.0.0.1:{api_port}"
        fake = fake_llm(llm_port, latency, "Let me think about it.", "So \\boxed{2}.")
        server = subprocess.Popen(
            [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(api_port),
             "--state-dir", tempfile.mkdtemp(prefix="rollserve-ray-bench-"), "--ray", cluster.address,
             "--backend", f"http://127.0.0.1:{llm_port}", "--init-workers", "1000",
             "--run-workers", "1000", "--eval-workers", "1000", "--log-level", "warning"])
        wait_http(f"http://127.0.0.1:{llm_port}/health", fake)
        wait_http(f"{url}/healthz", server, timeout=300)
        head = psutil.Process(server.pid)
        run_batch(url, 2 * SLOTS, head)  # warm up: every worker's first calls
        runs: dict[int, dict] = {}
        for nodes in range(1, NODES + 1):
            for i in range(NODES):
                action = "undrain" if i < nodes else "drain"
                httpx.post(f"{url}/v1/nodes/node{i}/{action}", timeout=30).raise_for_status()
            runs[nodes] = run_batch(url, per_node * nodes, head)
    finally:
        for proc in (server, fake):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
        cluster.shutdown()
    one = runs[1]["rollouts_per_s"]
    rows = [[n, r["rollouts"], round(r["seconds"], 2), round(r["rollouts_per_s"], 2),
             f"{r['rollouts_per_s'] / one:.2f}x", round(r["head_cpu_ms_per_rollout"], 1)]
            for n, r in runs.items()]
    name = "ray_scaling" if latency == DEFAULT_LATENCY else f"ray_scaling_latency{latency * 1000:.0f}ms"
    report(name, f"math rollouts, 2 turns, test-double LLM at {latency * 1000:.0f} ms/call, "
           f"{SLOTS} slots per node", ["nodes", "rollouts", "seconds", "rollouts/s", "speed-up",
                                       "head CPU ms/rollout"], rows,
           {"config": {"latency_s": latency, "per_node": per_node, "slots_per_node": SLOTS,
                       "turns_per_rollout": 2, "cores": psutil.cpu_count()},
            "results": {str(n): r for n, r in runs.items()}})
    assert all(r["none_lost_none_twice"] and r["completed"] == r["rollouts"] for r in runs.values()), runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--latency", type=float, default=DEFAULT_LATENCY)
    parser.add_argument("--per-node", type=int, default=96)
    args = parser.parse_args()
    main(args.latency, args.per_node)

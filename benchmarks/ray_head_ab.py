"""The Ray head's CPU per rollout: the old tree against this one, alternated, in one run.

Each arm is a fresh `ray.cluster_utils.Cluster` on this machine (a head without
rollserve slots, --nodes worker nodes of --slots slots), the test-double vLLM (each call
waits --latency seconds, two turns per episode) and `rollserve serve --ray`, with the
cluster's processes and the server both importing that arm's `src` (the old tree's: a
copy made with `git archive`; this tree's). After a warm-up batch, a batch of
--per-node x nodes math rollouts runs; the head's CPU (user + system of the `rollserve
serve` process: the API, the store, the engine and its Ray calls; the workers are Ray's
processes) is read around it. The arms alternate old, new, new, old, ... so a drift in
the shared machine's load falls on both.

    git archive BASE src | tar -x -C /tmp/rollserve-old
    python -m benchmarks.ray_head_ab --old-src /tmp/rollserve-old/src [--rounds 2]
        [--nodes 2] [--slots 16] [--per-node 96] [--latency 1.5] [--only new] [--profile DIR]

--profile records the head with py-spy during each measured batch (DIR/<arm>-<round>.txt,
collapsed stacks). Writes results/ray_head_ab.json (results/ray_head_ab_<N>slots.json at
other --slots); with --only new --profile DIR, results/ray_head_profile.json: the head's
CPU per rollout by thread, and its Python samples by part (the link to the nodes, the
store, the API, the engine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from ray.cluster_utils import Cluster

from benchmarks.common import fake_llm, free_port, report, wait_http
from benchmarks.ray_scaling import SLOTS, run_batch

NEW_SRC = Path(__file__).resolve().parents[1] / "src"
IDLE_S = 10.0


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """The process's CPU seconds so far by thread name (Ray's own threads are named; Python's
    threads are all "python" here), user + system."""
    by_name: dict[str, float] = {}
    for t in proc.threads():
        try:
            name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        by_name[name] = by_name.get(name, 0.0) + t.user_time + t.system_time
    return by_name


def arm(src: Path, nodes: int, slots: int, per_node: int, latency: float, profile: Path | None) -> dict:
    """One cluster, one server, one measured batch, everything importing ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src)  # the cluster's raylets (and so its workers) inherit it
    node = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    fake = server = spy = None
    try:
        for i in range(nodes):
            cluster.add_node(**node, resources={"rollserve": slots}, labels={"rollserve-node": f"node{i}"})
        llm_port, api_port = free_port(), free_port()
        url = f"http://127.0.0.1:{api_port}"
        fake = fake_llm(llm_port, latency, "Let me think about it.", "So \\boxed{2}.")
        state = Path(tempfile.mkdtemp(prefix="rollserve-ray-ab-"))
        log = (state / "server.log").open("w")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollserve.cli",
                "serve",
                "--port",
                str(api_port),
                "--state-dir",
                str(state),
                "--ray",
                cluster.address,
                "--backend",
                f"http://127.0.0.1:{llm_port}",
                "--init-workers",
                "1000",
                "--run-workers",
                "1000",
                "--eval-workers",
                "1000",
                "--log-level",
                "info",
            ],
            env=env,
            stderr=log,
            stdout=log,
        )
        wait_http(f"http://127.0.0.1:{llm_port}/health", fake)
        wait_http(f"{url}/healthz", server, timeout=300)
        head = psutil.Process(server.pid)
        run_batch(url, 2 * slots * nodes, head)  # warm up: every worker's first calls
        if profile is not None:
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            spy = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--gil",
                    "-r",
                    "200",
                    "--format",
                    "raw",
                    "-o",
                    str(profile),
                    "--pid",
                    str(server.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        threads = thread_cpu(head)
        result = run_batch(url, per_node * nodes, head)
        if spy is not None:  # the batch only (not the idle look nor the shutdown below)
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            spy.wait(timeout=60)
            spy = None
        result["head_cpu_ms_per_rollout_by_thread"] = {
            name: round(1000 * (seconds - threads.get(name, 0.0)) / result["rollouts"], 2)
            for name, seconds in sorted(thread_cpu(head).items(), key=lambda kv: -kv[1])
            if seconds - threads.get(name, 0.0) > 0
        }
        nodes_seen = httpx.get(f"{url}/v1/status", timeout=30).json().get("nodes") or []
        result["nodes_used"] = sum(1 for n in nodes_seen if n["alive"] and n["placed"] > 0)
        cpu = sum(head.cpu_times()[:2])
        time.sleep(IDLE_S)  # the head with nothing in flight: its fixed cost (node watch, status polls)
        result["head_idle_cpu_ms_per_s"] = 1000 * (sum(head.cpu_times()[:2]) - cpu) / IDLE_S
        result["rollouts_in_server_life"] = 2 * slots * nodes + result["rollouts"]
        server.terminate()
        server.wait(timeout=60)
        server = None
        log.close()
        # The new tree logs its batches at stop (the old one makes one call per request).
        counts = re.findall(r"(\d+) requests in (\d+) Ray calls", (state / "server.log").read_text())
        if counts:
            result["link_requests"] = sum(int(r) for r, _ in counts)
            result["link_ray_calls"] = sum(int(c) for _, c in counts)
        more = re.findall(
            r"\((\d+) polls\); (\d+) answers taken, (\d+) of them unused", (state / "server.log").read_text()
        )
        if more:
            result["link_polls"] = sum(int(p) for p, _, _ in more)
            result["link_answers"] = sum(int(a) for _, a, _ in more)
            result["link_answers_unused"] = sum(int(u) for _, _, u in more)
        return result
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            spy.wait(timeout=60)
        for proc in (server, fake):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
        cluster.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


# Where a sample of the head's Python (py-spy --gil: the thread holding the GIL) is spent:
# the first of these that one of its frames is in (so the store's work for an API read is
# the store's, pydantic's for the API the API's).
PARTS = [
    ("ray calls (the link to the nodes: pickling, submits, polls, Ray's Python side)", ("rollserve/cluster/", "ray/")),
    (
        "the store (SQLite on its thread, and the hops to it)",
        ("rollserve/engine/store/", "concurrent/futures/", "sqlite3"),
    ),
    (
        "the API (the trainer's submit and its reads of results: routes, validation, JSON)",
        ("rollserve/api/routes", "rollserve/api/guards", "fastapi/", "starlette/", "uvicorn/protocols", "h11/"),
    ),
    ("the engine (pipeline, pools, deadlines, events, results, group verdicts)", ("rollserve/engine/",)),
]


def python_parts(path: Path) -> dict[str, int]:
    """py-spy's raw (collapsed) samples by ``PARTS``; the rest as "other"."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        part = next(
            (name for name, marks in PARTS if any(mark in frame for frame in frames for mark in marks)),
            "other (asyncio, the loop, threads)",
        )
        counts[part] = counts.get(part, 0) + int(n)
    return counts


def profiled(name: str, results: list[dict], paths: list[Path]) -> None:
    """Write results/ray_head_profile.json: the head's CPU per rollout by thread (Ray's
    C++ threads by name, Python's together) and the Python share by ``PARTS``."""
    samples: dict[str, int] = {}
    for path in paths:
        for part, n in python_parts(path).items():
            samples[part] = samples.get(part, 0) + n
    total = sum(samples.values())
    run = results[-1]
    python_ms = run["head_cpu_ms_per_rollout_by_thread"].get("python", 0.0)
    rows = [
        [part, round(100 * n / total, 1), round(python_ms * n / total, 2)]
        for part, n in sorted(samples.items(), key=lambda kv: -kv[1])
    ]
    ray_threads = {k: v for k, v in run["head_cpu_ms_per_rollout_by_thread"].items() if k != "python"}
    rows += [[f"Ray's C++ threads ({', '.join(list(ray_threads)[:4])}, ...)", "", round(sum(ray_threads.values()), 2)]]
    report(
        "ray_head_profile",
        f"where the Ray head's CPU per rollout goes ({name} tree, under py-spy)",
        ["part", "share of Python samples %", "ms per rollout"],
        rows,
        {"tree": name, "results": results, "python_samples": samples},
    )


def main(
    old_src: Path,
    rounds: int,
    nodes: int,
    slots: int,
    per_node: int,
    latency: float,
    profile: Path | None,
    only: str | None = None,
) -> None:
    if not (old_src / "rollserve" / "__init__.py").is_file():
        raise SystemExit(f"--old-src {old_src}: no rollserve package there")
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for name in order:
            if only is not None and name != only:
                continue
            src = old_src if name == "old" else NEW_SRC
            spy = None if profile is None else profile / f"{name}-{i + 1}.txt"
            runs[name].append(arm(src, nodes, slots, per_node, latency, spy))
            print(f"round {i + 1} {name}: {runs[name][-1]['head_cpu_ms_per_rollout']:.2f} ms/rollout", flush=True)
    if only is not None:  # a look at one tree: no A/B; with --profile, where its head's CPU goes
        if profile is not None:
            profiled(only, runs[only], [profile / f"{only}-{i + 1}.txt" for i in range(rounds)])
        else:
            print(runs)
        return
    rows = []
    for name, results in runs.items():
        cpu = [r["head_cpu_ms_per_rollout"] for r in results]
        rate = [r["rollouts_per_s"] for r in results]
        rows.append(
            [
                name,
                len(results),
                results[0]["rollouts"],
                round(min(cpu), 2),
                round(statistics.median(cpu), 2),
                round(max(cpu), 2),
                round(statistics.median(rate), 2),
            ]
        )
    report(
        "ray_head_ab" if slots == SLOTS else f"ray_head_ab_{slots}slots",
        f"Ray head CPU per rollout, old tree vs new, alternated ({nodes} nodes x {slots} slots, "
        f"test-double LLM at {latency * 1000:.0f} ms/call, 2 turns)",
        ["tree", "runs", "rollouts per run", "head CPU ms/rollout min", "median", "max", "rollouts/s median"],
        rows,
        {
            "config": {
                "latency_s": latency,
                "nodes": nodes,
                "per_node": per_node,
                "slots_per_node": slots,
                "rounds": rounds,
                "turns_per_rollout": 2,
                "cores": psutil.cpu_count(),
            },
            "results": runs,
        },
    )
    assert all(r["none_lost_none_twice"] and r["completed"] == r["rollouts"] for rs in runs.values() for r in rs), runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--old-src", type=Path, required=True, help="the old tree's src folder")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=SLOTS, help="rollserve slots per node")
    parser.add_argument("--per-node", type=int, default=96)
    parser.add_argument("--latency", type=float, default=1.5)
    parser.add_argument("--profile", type=Path, default=None, help="a folder for py-spy's profiles of the head")
    parser.add_argument(
        "--only",
        choices=("old", "new"),
        default=None,
        help="run one tree's arms only (a profile): no A/B, no results file",
    )
    args = parser.parse_args()
    main(args.old_src, args.rounds, args.nodes, args.slots, args.per_node, args.latency, args.profile, args.only)

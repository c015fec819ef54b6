"""Two rollserve source trees side by side: the gateway's added latency per call, one
session, runs alternated between a server of each tree against one backend double.

For a change to the gateway's path: ``--before`` is a checkout of the old tree's
``src`` (``git worktree add`` or ``git archive``), the tree this runs in is the new
one. Each round runs every wire once on each server (the order alternating round by
round), so both see the same load over time; per wire, the per-call pairs of all
rounds pooled (``benchmarks/gateway_wires.py``: each call paired with its direct
replay, the backend's own time taken off at the backend), their p50/p99, and the
ratio after / before of the p50s; and each server's CPU over all its rounds' calls
divided by their number (the CPU clock ticks at 10 ms: pooled, not a median of
per-round values, so that more calls resolve it finer).

    python -m benchmarks.gateway_ab --before /tmp/old/src [--rounds 4] [--calls 15]
                                    [--before-hide httptools,uvloop] [--after-hide ...]

``--before-hide`` / ``--after-hide``: modules that server cannot import (a folder put
first on its path whose packages of those names raise ``ImportError``), for an A/B of an
optional dependency in one venv: uvicorn's ``auto`` HTTP parser and event loop then
fall back to h11 and asyncio's own loop.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import psutil

from benchmarks import gateway_wires
from benchmarks.common import free_port, median, percentile, report, wait_http

SRC = Path(__file__).resolve().parents[1] / "src"


async def _rounds(urls: dict[str, str], llm_url: str, servers: dict[str, psutil.Process],
                  rounds: int, calls: int) -> dict:
    pooled: dict = {label: {w: {"paired": [], "at_gateway": [], "cpu_ms": []}
                            for w in gateway_wires.WIRES} for label in urls}
    for label in urls:  # (a first short warm-up of each, dropped)
        await gateway_wires.run_wire(urls[label], llm_url, servers[label], "chat", 1, 3)
    labels = list(urls)
    for r in range(rounds):
        for wire in gateway_wires.WIRES:
            for label in (labels if r % 2 == 0 else labels[::-1]):
                d = await gateway_wires.run_wire(urls[label], llm_url, servers[label], wire, 1, calls)
                for k in ("paired", "at_gateway"):
                    pooled[label][wire][k] += d["_per_call"][k]
                pooled[label][wire]["cpu_ms"].append(d["server_cpu_ms_per_call"] * d["calls"])
    return pooled


def main(before: Path, rounds: int, calls: int, latency: float,
         hide: dict[str, list[str]] | None = None, name: str = "gateway_ab") -> None:
    hide = hide or {"before": [], "after": []}
    llm_port = free_port()
    llm = subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_wires", "--port", str(llm_port),
                            "--latency", str(latency)])
    llm_url = f"http://127.0.0.1:{llm_port}"
    ports = {"before": free_port(), "after": free_port()}
    procs = {"before": gateway_wires.server(before, ports["before"], llm_url, hide["before"]),
             "after": gateway_wires.server(SRC, ports["after"], llm_url, hide["after"])}
    load = [psutil.getloadavg()[0]]
    try:
        wait_http(f"{llm_url}/health", llm)
        for label, port in ports.items():
            wait_http(f"http://127.0.0.1:{port}/healthz", procs[label])
        pooled = asyncio.run(_rounds({k: f"http://127.0.0.1:{p}" for k, p in ports.items()}, llm_url,
                                     {k: psutil.Process(p.pid) for k, p in procs.items()}, rounds, calls))
    finally:
        for proc in (*procs.values(), llm):
            proc.terminate()
            proc.wait(timeout=60)
    load.append(psutil.getloadavg()[0])
    rows, results = [], []
    for wire in gateway_wires.WIRES:
        d = {label: {k: {"p50": median(v[k]), "p99": percentile(v[k], 99)} for k in ("paired", "at_gateway")}
             | {"server_cpu_ms_per_call": sum(v["cpu_ms"]) / len(v["paired"]), "calls": len(v["paired"])}
             for label, v in ((lb, pooled[lb][wire]) for lb in pooled)}
        results.append({"wire": wire, **d})
        b, a = d["before"], d["after"]
        rows.append([wire, a["calls"],
                     f"{b['at_gateway']['p50']:.2f} / {b['at_gateway']['p99']:.2f}",
                     f"{a['at_gateway']['p50']:.2f} / {a['at_gateway']['p99']:.2f}",
                     f"{a['at_gateway']['p50'] / b['at_gateway']['p50']:.2f}",
                     f"{b['paired']['p50']:.2f}", f"{a['paired']['p50']:.2f}",
                     f"{b['server_cpu_ms_per_call']:.2f}", f"{a['server_cpu_ms_per_call']:.2f}"])
    report(name, f"the gateway before / after, 1 session, {rounds} rounds x {calls} calls a wire "
           f"each, alternated; backend double at {latency * 1000:.0f} ms/call",
           ["wire", "calls each", "before: added at gateway ms (p50 / p99)",
            "after: added at gateway ms (p50 / p99)", "after/before p50", "before: paired p50 ms",
            "after: paired p50 ms", "before: server CPU ms/call", "after: server CPU ms/call"], rows,
           {"config": {"before_src": str(before), "hidden_modules": hide, "rounds": rounds, "calls": calls,
                       "llm_latency_s": latency,
                       "cores": psutil.cpu_count(), "load_average_start_end": load},
            "results": results})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the old tree's src folder")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=15, help="calls of the one session, per wire and round")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--before-hide", default="", help="modules the old tree's server cannot import")
    parser.add_argument("--after-hide", default="", help="modules this tree's server cannot import")
    parser.add_argument("--name", default="gateway_ab", help="the results file's name")
    args = parser.parse_args()
    main(args.before, args.rounds, args.calls, args.latency,
         {"before": [m for m in args.before_hide.split(",") if m],
          "after": [m for m in args.after_hide.split(",") if m]}, args.name)

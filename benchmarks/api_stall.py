"""Does one huge prompt stall the API? /healthz latency while a big question renders.

`rollserve serve` runs as its own process with the test-double vLLM as another; this
script submits one math task whose question is SIZE MB of text, and meanwhile asks
`GET /healthz` every 20 ms, for as long as the rollout lasts (at most --window s).
A server that renders and tokenizes on its event loop answers nothing until that is
done; one that does it on a worker thread keeps answering.

    python -m benchmarks.api_stall [--sizes 1 10] [--max-instance-mb 64]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time

import httpx

from benchmarks.common import free_port, median, percentile, report, terminate, wait_http


async def probe(url: str, size_mb: float, window: float) -> dict:
    question = "What is 2 + 2? " + "x" * int(size_mb * 1_000_000)
    body = {"tasks": [{"data_source": "math", "instance": {"question": question, "answer": "4"}}],
            "sampling": {"max_tokens": 16}}
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=window + 60) as client:
        started = time.perf_counter()
        r = await client.post("/v1/rollouts", json=body)
        submitted = time.perf_counter() - started
        if r.status_code != 202:
            return {"status": r.status_code, "detail": r.json().get("detail", "")[:200],
                    "submit_s": submitted}
        rollout_id = r.json()["groups"][0]["rollout_ids"][0]
        deadline = time.perf_counter() + window
        done = None
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await client.get("/healthz")
            latencies.append(time.perf_counter() - t0)
            view = (await client.get(f"/v1/rollouts/{rollout_id}")).json()
            if view["done"]:
                done = view["status"]
                break
            await asyncio.sleep(0.02)
        return {"status": 202, "submit_s": submitted, "rollout": done,
                "healthz_max_s": max(latencies), "healthz_p50_s": median(latencies),
                "healthz_p99_s": percentile(latencies, 99), "probes": len(latencies),
                "elapsed_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--max-instance-mb", type=float, default=64.0,
                        help="the server's cap, raised so the sizes above are admitted")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    llm_port, port = free_port(), free_port()
    state = tempfile.mkdtemp(prefix="rollserve-stall-")
    llm = subprocess.Popen([sys.executable, "-m", "rollserve.cli", "fake-llm", "--port",
                            str(llm_port), "--reply", "\\boxed{4}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    serve = [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(port), "--state-dir",
             state, "--backend", f"http://127.0.0.1:{llm_port}", "--log-level", "warning"]
    if args.max_instance_mb:
        serve += ["--max-instance-mb", str(args.max_instance_mb),
                  "--max-request-mb", str(max(64.0, 2 * args.max_instance_mb))]
    server = subprocess.Popen(serve)
    rows, runs = [], []
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/health", llm)
        wait_http(f"http://127.0.0.1:{port}/healthz", server)
        for size in args.sizes:
            run = asyncio.run(probe(f"http://127.0.0.1:{port}", size, args.window))
            runs.append({"size_mb": size, **run})
            rows.append([size, run["status"], run.get("rollout"), run.get("healthz_p50_s"),
                         run.get("healthz_max_s"), run.get("elapsed_s")])
    finally:
        terminate(server, llm, timeout=15)
    name = "api_stall" + (f"_{args.label}" if args.label else "")
    report(name, "GET /healthz while one huge question renders",
           ["question MB", "submit", "rollout", "healthz p50 s", "healthz max s", "rollout s"],
           rows, {"runs": runs})


if __name__ == "__main__":
    main()

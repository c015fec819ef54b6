"""Shared by the benchmarks: machine facts, a rich table, JSON under results/, and the
test-double LLM and servers they start as processes."""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(name: str, title: str, columns: list[str], rows: list[list], data: dict) -> Path:
    """Print a table and write ``results/<name>.json`` (config, rows, machine)."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row])
    Console(width=160).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "columns": columns, "rows": rows, **data}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    Console().print(f"wrote {path}")
    return path


def state_dir(prefix: str = "rollserve-bench-") -> str:
    """A fresh folder for a server's state (its store, its sandboxes), removed when this
    process exits (a 65,000-rollout run leaves about 350 MB of store)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


def terminate(*procs: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM each process, wait ``timeout`` s for it, then kill it (bounded either way)."""
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=60)


def fake_llm(port: int, latency: float, *replies: str, paused: bool = False) -> subprocess.Popen:
    """The test-double vLLM as its own process, answering ``replies`` in turn;
    ``paused``: every call waits until a ``POST /resume``."""
    return subprocess.Popen(
        [sys.executable, "-m", "rollserve.testing.fake_vllm", "--port", str(port),
         "--latency", str(latency), *(["--paused"] if paused else []), "--reply", *replies],
        stdout=subprocess.DEVNULL)

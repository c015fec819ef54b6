"""Where the gateway's server CPU goes per model call, by section: this tree's server
sampled by py-spy (``--gil``: only the thread holding the GIL, i.e. Python's CPU) while
one session makes ``--calls`` calls on each wire against the backend double.

Each sample is charged to the innermost frame that names a section (``SECTIONS``, from
the stack's leaf upwards): the policy tokenizer, the client call to the backend,
JSON/pydantic (parse, validate, render), the gateway's session logic, thread
hand-offs, the HTTP server (uvicorn, Starlette, FastAPI, the routes), the event loop.
Writes ``results/gateway_profile.json``: per wire, ms of sampled CPU per call and the
share of each section. py-spy is not a dependency of rollserve: pass its binary.

    python -m benchmarks.gateway_profile --py-spy /path/to/py-spy [--calls 40]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import psutil

from benchmarks import gateway_wires
from benchmarks.common import free_port, report, wait_http

RATE = 500  # samples a second
# (section, path fragments); the first section, from the leaf up, that a frame names.
SECTIONS = [
    ("policy tokenizer", ("tokenizers", "transformers/", "jinja2/", "rollserve/llm/tokens/")),
    ("backend client", ("aiohttp/", "rollserve/llm/backends/", "rollserve/llm/routing/")),
    ("JSON and pydantic", ("pydantic", "json/", "rollserve/validation", "rollserve/contract/",
                           "agent/gateway/wire.py", "anthropic_wire.py", "responses_wire.py",
                           "agent/gateway/sliced.py")),
    ("gateway session", ("agent/gateway/", "rollserve/agent/", "rollserve/engine/")),
    ("thread hand-offs", ("concurrent/futures/", "asyncio/threads.py", "threading.py", "queue.py")),
    ("HTTP server", ("uvicorn/", "starlette/", "fastapi/", "rollserve/api/", "h11/", "httptools")),
    ("event loop", ("asyncio/", "uvloop", "selectors.py")),
]


def _section(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for name, fragments in SECTIONS:
            if any(f in frame for f in fragments):
                return name
    return "other"


async def _calls(api: str, llm: str, proc: psutil.Process, spy: str, calls: int, out: Path) -> dict:
    await gateway_wires.run_wire(api, llm, proc, "chat", 1, 3)  # warm-up, not sampled
    found = {}
    for wire in gateway_wires.WIRES:
        raw = out / f"{wire}.txt"
        sampler = subprocess.Popen([spy, "record", "--gil", "-r", str(RATE), "-f", "raw", "-o", str(raw),
                                    "-p", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # (py-spy attaches)
        d = await gateway_wires.run_wire(api, llm, proc, wire, 1, calls)
        sampler.send_signal(signal.SIGINT)
        sampler.wait(timeout=60)
        counts: Counter[str] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                counts[_section(stack)] += int(n)
        total = sum(counts.values())
        found[wire] = {"calls": d["calls"], "samples": total,
                       "sampled_cpu_ms_per_call": 1000 * total / RATE / d["calls"],
                       "server_cpu_ms_per_call": d["server_cpu_ms_per_call"],
                       "added_at_gateway_ms": d["added_at_gateway_ms"], "load_average": d["load_average"],
                       "sections_ms_per_call": {k: 1000 * v / RATE / d["calls"] for k, v in counts.most_common()},
                       "sections_share": {k: v / total for k, v in counts.most_common()}}
    return found


def main(args: argparse.Namespace) -> None:
    llm_port, port = free_port(), free_port()
    llm = subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_wires", "--port", str(llm_port)])
    llm_url = f"http://127.0.0.1:{llm_port}"
    proc = gateway_wires.server(gateway_wires.SRC, port, llm_url)
    try:
        wait_http(f"{llm_url}/health", llm)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        found = asyncio.run(_calls(f"http://127.0.0.1:{port}", llm_url, psutil.Process(proc.pid),
                                   args.py_spy, args.calls, Path(tempfile.mkdtemp(prefix="gateway-profile-"))))
    finally:
        for p in (proc, llm):
            p.terminate()
            p.wait(timeout=60)
    names = [name for name, _ in SECTIONS] + ["other"]
    rows = [[wire, d["calls"], f"{d['load_average']:.1f}", f"{d['sampled_cpu_ms_per_call']:.2f}",
             *(f"{d['sections_ms_per_call'].get(n, 0.0):.2f}" for n in names)] for wire, d in found.items()]
    report("gateway_profile", "the gateway's server CPU per call by section (py-spy --gil samples), 1 session",
           ["wire", "calls", "load avg", "sampled CPU ms/call", *(f"{n} ms/call" for n in names)], rows,
           {"config": {"calls": args.calls, "rate_hz": RATE, "sections": SECTIONS, "cores": psutil.cpu_count()},
            "results": found})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--py-spy", required=True, help="the py-spy binary (not a dependency of rollserve)")
    parser.add_argument("--calls", type=int, default=40, help="calls of the one session, per wire")
    main(parser.parse_args())

"""Where the server's CPU goes during ``benchmarks.concurrency``'s 2,000 math rollouts, by
section: the server sampled by py-spy (``--gil``: only the thread holding the GIL, i.e.
Python's CPU) from the trainer's first submit to its last result, for this tree and,
with ``--before``, an old tree's ``src`` (run before it, on the same machine).

Each sample is charged to the first section a frame names, from the stack's leaf up
(``SECTIONS``): the client side of the LLM calls (aiohttp), the router, the tokenizer
and chat template, JSON and pydantic, the store, the API's HTTP server and routes, the
engine, the agent loop and math handler, the scoring pool's hand-off, thread
hand-offs, the event loop. Writes ``results/concurrency_profile.json``: per tree, the
server's measured CPU ms per rollout and each section's share of the samples and
its ms per rollout (share x measured CPU). py-spy is not a dependency of rollserve:
pass its binary.

    python -m benchmarks.concurrency_profile --py-spy /path/to/py-spy [--before OLD/src]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks import concurrency
from benchmarks.common import report

RATE = 200  # samples a second
# (section, path fragments); the first section, from the leaf up, that a frame names.
SECTIONS = [
    ("tokenizer and chat template", ("tokenizers", "transformers/", "jinja2/", "rollserve/llm/tokens/")),
    ("JSON and pydantic", ("pydantic", "json/", "rollserve/contract/")),
    ("store (SQLite)", ("sqlite3", "rollserve/engine/store/")),
    ("LLM client (aiohttp)", ("aiohttp/", "yarl/", "multidict/", "rollserve/llm/backends/")),
    ("router", ("rollserve/llm/routing/",)),
    ("scoring hand-off", ("pebble/", "multiprocessing/", "rollserve/handlers/scoring.py")),
    ("API (HTTP server, routes)", ("uvicorn/", "starlette/", "fastapi/", "rollserve/api/", "h11/", "httptools")),
    ("agent loop and math handler", ("rollserve/agent/", "rollserve/handlers/")),
    ("engine (pipeline, pools, events)", ("rollserve/engine/",)),
    ("thread hand-offs", ("concurrent/futures/", "asyncio/threads.py", "threading.py", "queue.py")),
    ("event loop", ("asyncio/", "selectors.py")),
]


def section(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for name, fragments in SECTIONS:
            if any(f in frame for f in fragments):
                return name
    return "other"


def sampled_run(src: Path, spy: str, setup: concurrency.Setup) -> tuple[dict, list[str]]:
    """One ``concurrency.run_once`` of the tree at ``src``, its server sampled by py-spy
    from the trainer's start to its end: the run's data and py-spy's raw lines. The
    trainer's arguments pass through as they are (its signature grows: ``doubles``)."""
    raw = Path(tempfile.mkdtemp(prefix="rollserve-profile-")) / "server.txt"
    samplers: list[subprocess.Popen] = []
    trainer = concurrency.trainer

    async def sampled(url: str, setup: concurrency.Setup, server: psutil.Process, *args: Any, **kwargs: Any) -> dict:
        samplers.append(subprocess.Popen([spy, "record", "--gil", "-r", str(RATE), "-f", "raw", "-o", str(raw),
                                          "-p", str(server.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return await trainer(url, setup, server, *args, **kwargs)

    concurrency.trainer = sampled  # type: ignore[assignment]
    try:
        data = concurrency.run_once(src, setup)
    finally:
        concurrency.trainer = trainer
        for sampler in samplers:
            sampler.wait(timeout=120)  # it writes its file once the server has exited
    return data, raw.read_text().splitlines()


def profile(src: Path, spy: str, setup: concurrency.Setup) -> dict:
    """Each section's share of the server's samples in one sampled run."""
    data, lines = sampled_run(src, spy, setup)
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[section(stack)] += int(n)
    total = sum(counts.values()) or 1
    cpu = data["server_process_cpu_ms_per_rollout"]
    return {
        "server_process_cpu_ms_per_rollout": cpu,
        "cpu_ms_per_rollout_with_scoring_workers": data["cpu_ms_per_rollout"],
        "load_avg_1m_before": data["load_avg_1m_before"],
        "samples": total,
        "sections": {name: {"share": counts[name] / total, "ms_per_rollout": cpu * counts[name] / total}
                     for name in [*(s for s, _ in SECTIONS), "other"]},
    }


def main(spy: str, before: Path | None, setup: concurrency.Setup, name: str = "concurrency_profile",
         run=None) -> None:
    """Profile ``before`` (if given) then this tree with ``run`` (default ``profile``) and
    report the sections side by side as ``name``."""
    run = run or profile
    trees = {"before": before, "after": concurrency.SRC} if before is not None else {"after": concurrency.SRC}
    runs = {label: run(src, spy, setup) for label, src in trees.items()}
    names = [*(s for s, _ in SECTIONS), "other"]
    columns = ["section", *(f"{label} ms/rollout (share)" for label in runs)]
    rows = [[name, *(f"{r['sections'][name]['ms_per_rollout']:.2f} ({100 * r['sections'][name]['share']:.1f}%)"
                     for r in runs.values())] for name in names]
    rows.append(["server process CPU ms/rollout", *(f"{r['server_process_cpu_ms_per_rollout']:.2f}"
                                                    for r in runs.values())])
    report(name, f"server CPU per rollout by section (py-spy --gil), {setup.rollouts} math rollouts",
           columns, rows, {"config": {"rollouts": setup.rollouts, "n": setup.n, "llm_latency_s": setup.latency,
                                      "rate": RATE, "before_src": str(before) if before else None},
                           "results": runs})


def cli(description: str | None, name: str = "concurrency_profile", run=None) -> None:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--py-spy", required=True, help="the py-spy binary (not a dependency of rollserve)")
    parser.add_argument("--before", type=Path, default=None, help="an old tree's src folder, profiled first")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    main(args.py_spy, args.before, concurrency.Setup(rollouts=args.rollouts, latency=args.latency), name, run)


if __name__ == "__main__":
    cli(__doc__)

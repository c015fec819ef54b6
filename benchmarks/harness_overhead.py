"""What running an agent harness through a preset costs, per preset installed here.

`rollserve serve` runs as its own process (``--harness-dir``: an install root made
for the run, holding rollserve's own test preset ``rs-test`` from
``tests/local_preset.py``, plus every preset already installed under
``--installed``); the test-double vLLM runs in a thread of this process (``--latency`` seconds
per call), scripted like a policy acting through a bash tool: ``--calls - 1`` steps
(``echo step N`` as a Hermes tool call), then mini-swe-agent's submit command. Each
preset runs ``--runs`` `gateway` rollouts one after another, its harness in a
bubblewrap sandbox behind the recording gateway.

Per preset:
- INIT start -> first model call (s): from the rollout's INIT start (submit time plus
  its queueing) to the first call's arrival at the backend: the sandbox's start,
  the harness's own start, its first request through the forwarder and the gateway.
- added latency per call (ms, p50/p99): each call as the harness timed it inside the
  sandbox (presets that report it: rs-test prints each call's time), paired with a
  direct replay of the same prompt ids (read from the trajectory) on the backend
  (``/v1/completions``, the body rollserve's vLLM backend sends): the percentiles of
  the per-call differences, never a difference of percentiles. Presets whose harness
  does not time its calls show none.
- server CPU ms per call: the server process's CPU over the preset's rollouts (the
  sandboxes' start and end included) divided by its calls.

    python -m benchmarks.harness_overhead [--runs 5] [--calls 6] [--latency 0.1]
                                          [--installed ~/.cache/rollserve/harnesses]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from tests.local_preset import NAME, make_local_preset

from benchmarks.common import free_port, median, percentile, report, wait_http
from rollserve.agent.harnesses.install import available, install, install_root, installed_problem
from rollserve.agent.tool_calls import format_tool_call
from rollserve.contract import SamplingParams
from rollserve.llm.backends.vllm import completions_body
from rollserve.testing import FakeVLLM

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MAX_TOKENS = 64
# Per preset: its instance.harness options (rs-test stops on mini's submit text).
OPTIONS = {NAME: {"stop": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
SKIPPED = {"command"}  # no program of its own


class Policy:
    """The scripted policy: steps, then submit; keeps each call's arrival time."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.arrivals: list[float] = []

    def __call__(self, prompt_ids: list[int], prompt: str) -> str:
        self.arrivals.append(time.perf_counter())
        turn = prompt.count("<|im_start|>assistant") - 1
        command = f"echo step {turn}" if turn < self.calls - 1 else SUBMIT
        return f"THOUGHT: step {turn}.\n\n" + format_tool_call("bash", {"command": command})


def prompts_of(trajectory: dict) -> list[list[int]]:
    sequence: list[int] = []
    out = []
    for turn in trajectory["turns"]:
        if turn.get("sequence", 0) != 0:
            break  # (a harness that rewrote its history: the first sequence only)
        sequence += turn["prompt_ids_delta"]
        out.append(list(sequence))
        sequence += turn["output_ids"]
    return out


def harness_ms(log: str) -> list[float]:
    """The per-call times a harness printed (rs-test: ``GOT {"ms": ...}``)."""
    return [float(json.loads(line[4:])["ms"]) for line in log.splitlines() if line.startswith("GOT {")]


async def run_preset(api: httpx.AsyncClient, llm: FakeVLLM, policy: Policy, server: psutil.Process,
                     name: str, runs: int, calls: int) -> dict:
    starts, added, harness_calls, failures = [], [], 0, []
    cpu = server.cpu_times()
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    async with httpx.AsyncClient(base_url=llm.url, timeout=120) as direct:
        for run in range(runs):
            policy.arrivals.clear()
            t0 = time.perf_counter()
            r = await api.post("/v1/rollouts", json={
                "tasks": [{"data_source": "gateway", "instance": {
                    "answer": "unused", "task": f"Run {run}: fix the bug.",
                    "harness": {"preset": name, **OPTIONS.get(name, {})}}}],
                "sampling": {"max_tokens": MAX_TOKENS}, "agent": {"max_turns": calls + 2}})
            r.raise_for_status()
            rid = r.json()["groups"][0]["rollout_ids"][0]
            view = (await api.get(f"/v1/rollouts/{rid}", params={"wait": 300})).json()
            result = view["result"]
            if result["status"] != "completed" or not policy.arrivals:
                failures.append((result["failure"] or {}).get("message", result["status"])[:300])
                continue
            starts.append(policy.arrivals[0] - t0 - result["timing"].get("queued", 0.0))
            harness_calls += len(result["trajectory"]["turns"])
            timed = harness_ms((result["evaluation"] or {}).get("harness_log_tail", ""))
            for prompt, through in zip(prompts_of(result["trajectory"]), timed):
                t1 = time.perf_counter()
                (await direct.post("/v1/completions", json=completions_body(llm.model, prompt, sampling))
                 ).raise_for_status()
                added.append(through - 1000 * (time.perf_counter() - t1))
    after = server.cpu_times()
    cpu_ms = 1000 * (after.user + after.system - cpu.user - cpu.system) / max(harness_calls, 1)
    return {"preset": name, "runs": runs, "completed": len(starts), "calls": harness_calls,
            "failures": failures,
            "init_to_first_call_s": {"p50": median(starts), "max": max(starts, default=float("nan"))},
            "added_ms": ({"p50": median(added), "p99": percentile(added, 99), "pairs": len(added)}
                         if added else None),
            "server_cpu_ms_per_call": cpu_ms}


async def measure(api_url: str, llm: FakeVLLM, policy: Policy, server: psutil.Process, names: list[str],
                  runs: int, calls: int) -> list[dict]:
    async with httpx.AsyncClient(base_url=api_url, timeout=330) as api:
        return [await run_preset(api, llm, policy, server, name, runs, calls) for name in names]


def prepare(root: Path, installed: Path, work: Path) -> list[str]:
    """The install root for the run: rs-test installed, installed presets linked in;
    the presets that can run."""
    env = make_local_preset(root, work)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        install(available(root)[NAME], root, log=lambda line: None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    found = available(root)
    for name, preset in found.items():
        if preset.package.kind == "npm" and name != NAME and (installed / name).is_dir():
            (root / name).symlink_to(installed / name)
    return [n for n, p in sorted(found.items()) if n not in SKIPPED and installed_problem(p, root) is None]


def main(runs: int, calls: int, latency: float, installed: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="rollserve-harness-bench-", dir="/tmp"))
    root.chmod(0o755)
    work = Path(tempfile.mkdtemp(prefix="rollserve-harness-bench-work-"))
    names = prepare(root, installed, work)
    api_port = free_port()
    state = tempfile.mkdtemp(prefix="rollserve-bench-")
    policy = Policy(calls)
    llm = FakeVLLM("smollm2", replies=policy, latency=latency).start_in_thread()
    server = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(api_port), "--state-dir", state,
         "--backend", llm.url, "--harness-dir", str(root), "--log-level", "warning"])
    try:
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server)
        data = asyncio.run(measure(f"http://127.0.0.1:{api_port}", llm, policy, psutil.Process(server.pid),
                                   names, runs, calls))
    finally:
        server.terminate()
        server.wait(timeout=60)
        llm.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    rows = [[d["preset"], f"{d['completed']}/{d['runs']}", d["calls"],
             f"{d['init_to_first_call_s']['p50']:.2f} / {d['init_to_first_call_s']['max']:.2f}",
             (f"{d['added_ms']['p50']:.1f} / {d['added_ms']['p99']:.1f}" if d["added_ms"] else "-"),
             f"{d['server_cpu_ms_per_call']:.1f}"] for d in data]
    report("harness_overhead",
           f"harness presets: {runs} rollouts x {calls} calls each, one at a time; "
           f"test-double vLLM at {latency * 1000:.0f} ms/call; bubblewrap sandboxes",
           ["preset", "completed", "calls", "INIT start -> 1st call s (p50 / max)",
            "added ms/call, paired (p50 / p99)", "server CPU ms/call (whole rollout)"], rows,
           {"config": {"runs": runs, "calls": calls, "llm_latency_s": latency, "max_tokens": MAX_TOKENS,
                       "cores": psutil.cpu_count(), "load_average": psutil.getloadavg()[0],
                       "server": "rollserve serve, its own process",
                       "backend": "rollserve.testing.FakeVLLM, in the benchmark's process"},
            "results": data})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=6, help="model calls per rollout")
    parser.add_argument("--latency", type=float, default=0.1, help="backend seconds per call")
    parser.add_argument("--installed", type=Path, default=install_root(),
                        help="where presets are installed already (linked into the run's root)")
    args = parser.parse_args()
    main(args.runs, args.calls, args.latency, args.installed)

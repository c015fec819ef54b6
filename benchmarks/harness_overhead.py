"""What running an agent harness through a preset costs: per preset, its start; per
wire, the gateway's added latency and server CPU per model call.

`rollserve serve` runs as its own process, its install root ``--installed`` (every
preset installed there runs; ``command`` has no program of its own).

1. Per preset (the real program, in the rollout's bubblewrap sandbox, through the HTTP
   API): ``--runs`` `gateway` rollouts one after another, the harness behind the
   recording gateway; the test-double vLLM runs in a thread of this process
   (``--latency`` s per call), scripted as a policy that makes the harness run one
   shell command with its own shell tool (a Hermes tool call the gateway turns into
   the wire's), then finish (mini-swe-agent: its submit command; the others: a plain
   answer). Measured:
   - INIT start -> first model call (s): from the rollout's INIT start (the submit's
     time plus its queueing) to the first call's arrival at the backend: the
     sandbox's start, the harness's own start (Node, Bun or Python), its first request
     through the in-sandbox forwarder and the gateway.
   - server CPU ms per call: the server process's CPU over the preset's rollouts
     (sandbox start and end included) divided by the calls.
2. Per wire (Chat Completions, Responses, Anthropic Messages), 1 session then
   ``--sessions`` at once, against a backend double in its own process: see
   ``benchmarks/gateway_wires.py`` (each gateway call paired with the direct replay
   of its prompt ids; percentiles of the per-call differences, never differences of
   percentiles; the backend's own time on each call taken off at the backend).

    python -m benchmarks.harness_overhead [--runs 3] [--latency 0.1] [--sessions 20]
                                          [--solo-calls 40] [--calls 5]
                                          [--installed ~/.cache/rollserve/harnesses]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from benchmarks import gateway_wires
from benchmarks.common import free_port, median, report, state_dir, wait_http
from rollserve.agent.harnesses.install import available, install_root, installed_problem
from rollserve.agent.tool_calls import format_tool_call
from rollserve.testing import FakeVLLM

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MAX_TOKENS = 64
SKIPPED = {"command"}  # no program of its own
COMMAND = "echo harness-bench-ok"
# Each harness's own shell tool and its arguments (the harness's tool schema).
SHELL = {
    "mini-swe-agent": ("bash", {"command": COMMAND}),
    "codex": ("exec_command", {"cmd": COMMAND}),
    "claude-code": ("Bash", {"command": COMMAND}),
    "opencode": ("bash", {"command": COMMAND, "description": "print a line"}),
    "qwen-code": ("run_shell_command", {"command": COMMAND}),
    "pi": ("bash", {"command": COMMAND}),
}
WIRE = {"openai-chat": "chat", "openai-responses": "responses", "anthropic": "anthropic"}


class Policy:
    """The scripted policy for the preset being measured: one shell command, then
    finish; keeps each call's arrival time."""

    def __init__(self) -> None:
        self.preset = ""
        self.arrivals: list[float] = []

    def __call__(self, prompt_ids: list[int], prompt: str) -> str:
        self.arrivals.append(time.perf_counter())
        if "You are a title generator" in prompt:  # OpenCode's title (an auxiliary call)
            return "Printing a line"
        if prompt.count("<|im_start|>assistant") - 1 == 0:
            return "I will run it.\n" + format_tool_call(*SHELL[self.preset])
        if self.preset == "mini-swe-agent":
            return "THOUGHT: done.\n\n" + format_tool_call("bash", {"command": SUBMIT})
        return "DONE"


async def run_preset(api: httpx.AsyncClient, policy: Policy, server: psutil.Process,
                     name: str, runs: int) -> dict:
    starts: list[float] = []
    calls, failures = 0, []
    policy.preset = name
    cpu = server.cpu_times()
    for run in range(runs):
        policy.arrivals.clear()
        t0 = time.perf_counter()
        r = await api.post("/v1/rollouts", json={
            "tasks": [{"data_source": "gateway", "instance": {
                "answer": "unused", "task": f"Run {run}: print a line with the shell.",
                "harness": {"preset": name}}}],
            "sampling": {"max_tokens": MAX_TOKENS},
            "agent": {"max_turns": 4, "max_context_tokens": 32768}})
        r.raise_for_status()
        rid = r.json()["groups"][0]["rollout_ids"][0]
        result = (await api.get(f"/v1/rollouts/{rid}", params={"wait": 300})).json()["result"]
        if result["status"] != "completed" or not policy.arrivals:
            failures.append((result["failure"] or {}).get("message", result["status"])[:300])
            continue
        starts.append(policy.arrivals[0] - t0 - result["timing"].get("queued", 0.0))
        calls += len(policy.arrivals)
    after = server.cpu_times()
    return {"preset": name, "runs": runs, "completed": len(starts), "calls": calls,
            "failures": failures,
            "init_to_first_call_s": {"p50": median(starts), "max": max(starts, default=float("nan"))},
            "server_cpu_ms_per_call": 1000 * (after.user + after.system - cpu.user - cpu.system)
            / max(calls, 1)}


async def run_presets(api_url: str, policy: Policy, server: psutil.Process, names: list[str],
                      runs: int) -> list[dict]:
    async with httpx.AsyncClient(base_url=api_url, timeout=330) as api:
        return [await run_preset(api, policy, server, name, runs) for name in names]


def serve(port: int, backend: str, root: Path) -> subprocess.Popen:
    state = state_dir()
    return subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(port), "--state-dir", state,
         "--backend", backend, "--harness-dir", str(root), "--init-workers", "32",
         "--run-workers", "32", "--log-level", "warning"])


def measure_presets(names: list[str], runs: int, latency: float, root: Path) -> list[dict]:
    policy = Policy()
    llm = FakeVLLM("smollm2", replies=policy, latency=latency).start_in_thread()
    port = free_port()
    server = serve(port, llm.url, root)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", server)
        return asyncio.run(run_presets(f"http://127.0.0.1:{port}", policy,
                                       psutil.Process(server.pid), names, runs))
    finally:
        server.terminate()
        server.wait(timeout=60)
        llm.stop()


def measure_wires(latency: float, root: Path, runs: list[tuple[int, int]]) -> list[dict]:
    llm_port, port = free_port(), free_port()
    llm = subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_wires", "--port", str(llm_port),
                            "--latency", str(latency)])
    llm_url = f"http://127.0.0.1:{llm_port}"
    server = serve(port, llm_url, root)
    try:
        wait_http(f"{llm_url}/health", llm)
        wait_http(f"http://127.0.0.1:{port}/healthz", server)
        return asyncio.run(gateway_wires.measure(f"http://127.0.0.1:{port}", llm_url,
                                                 psutil.Process(server.pid), runs))
    finally:
        for proc in (server, llm):
            proc.terminate()
            proc.wait(timeout=60)


def _pq(d: dict) -> str:
    return f"{d['p50']:.2f} / {d['p99']:.2f}"


def main(args: argparse.Namespace) -> None:
    root = args.installed
    found = available(root)
    names = [n for n, p in sorted(found.items()) if n not in SKIPPED and installed_problem(p, root) is None]
    load = [psutil.getloadavg()[0]]
    presets = measure_presets(names, args.runs, args.latency, root) if args.runs else []
    load.append(psutil.getloadavg()[0])
    wires = measure_wires(args.latency, root, [(1, args.solo_calls), (args.sessions, args.calls)])
    load.append(psutil.getloadavg()[0])
    for d in wires:
        d.pop("_per_call")
    gateway_columns = ["wire", "sessions", "calls", "load avg", "direct p50 / p99 ms",
                       "gateway p50 / p99 ms", "added, paired (p50 / p99) ms",
                       "added, at the gateway (p50 / p99) ms", "server CPU ms/call"]
    gateway_rows = [[d["wire"], d["sessions"], d["calls"], f"{d['load_average']:.1f}",
                     _pq(d["direct_ms"]), _pq(d["gateway_ms"]), _pq(d["added_paired_ms"]),
                     _pq(d["added_at_gateway_ms"]), f"{d['server_cpu_ms_per_call']:.2f}"]
                    for d in wires]
    table = Table(title="the gateway per call, per wire")
    for column in gateway_columns:
        table.add_column(column, justify="right")
    for row in gateway_rows:
        table.add_row(*map(str, row))
    Console(width=200).print(table)
    rows = [[d["preset"], WIRE[found[d["preset"]].wire], f"{d['completed']}/{d['runs']}", d["calls"],
             f"{d['init_to_first_call_s']['p50']:.2f} / {d['init_to_first_call_s']['max']:.2f}",
             f"{d['server_cpu_ms_per_call']:.1f}"] for d in presets]
    report("harness_overhead",
           f"harness presets: {args.runs} rollouts each, one at a time; test-double vLLM at "
           f"{args.latency * 1000:.0f} ms/call; bubblewrap sandboxes",
           ["preset", "wire", "completed", "calls", "INIT start -> 1st call s (p50 / max)",
            "server CPU ms/call (whole rollout)"], rows,
           {"gateway_columns": gateway_columns, "gateway_rows": gateway_rows,
            "config": {"runs": args.runs, "llm_latency_s": args.latency, "max_tokens": MAX_TOKENS,
                       "solo_calls": args.solo_calls, "sessions": args.sessions,
                       "calls_per_session": args.calls, "cores": psutil.cpu_count(),
                       "load_average_start_presets_end": load,
                       "server": "rollserve serve, its own process",
                       "backend": "rollserve.testing.FakeVLLM: in this process for the presets, "
                                  "its own process (benchmarks.gateway_wires) for the wires"},
            "results": presets, "gateway": wires})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="rollouts per preset (0: none)")
    parser.add_argument("--latency", type=float, default=0.1, help="backend seconds per call")
    parser.add_argument("--solo-calls", type=int, default=40, help="calls of the one session, per wire")
    parser.add_argument("--sessions", type=int, default=20, help="sessions at once, per wire")
    parser.add_argument("--calls", type=int, default=5, help="calls per session of --sessions")
    parser.add_argument("--installed", type=Path, default=install_root(),
                        help="the install root the server uses (its presets run)")
    main(parser.parse_args())

"""The recording gateway's overhead per model call, against calling the backend directly.

`rollserve serve` runs as its own process, the test-double vLLM as another (a fixed
short reply, ``--latency`` seconds per call), and this script plays the harnesses: N
`gateway` rollouts at once, each a session making ``--calls`` calls back to back (a
growing conversation: the reply, then a short user message), through the OpenAI wire
(``/chat/completions``) and then, with a fresh batch, the Anthropic wire
(``/v1/messages``), as raw JSON over one HTTP client (no SDK on either side).

The direct baseline replays exactly the prompts the gateway sent (each turn's token
ids, read from the rollouts' trajectories) to the same test double's
``/v1/completions`` with the body rollserve's vLLM backend sends, with the same number
of sessions at once, each replaying its calls back to back. Overhead = a percentile of
the gateway's call latency minus the same percentile of the direct calls' (the
difference of the two distributions, not a per-call pairing). Also reported: the
server's CPU time per gateway call (its process, over the calls only).

One session alone (``--solo-calls`` calls) is measured first: the overhead without
contention; then ``--sessions`` at once.

    python -m benchmarks.gateway_overhead [--sessions 200] [--calls 5] [--solo-calls 40]
                                          [--latency 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import httpx
import psutil

from benchmarks.common import fake_llm, free_port, median, percentile, report, state_dir, wait_http
from rollserve.contract import SamplingParams
from rollserve.llm.backends.vllm import completions_body

REPLY = "I will look at the repository first."
SYSTEM = "You are a coding agent."
MAX_TOKENS = 32
# Idle connections are dropped after 1 s, well before uvicorn closes them (5 s): a call
# sent on a connection the server is closing would fail.
LIMITS = httpx.Limits(max_connections=2000, max_keepalive_connections=2000, keepalive_expiry=1.0)


def _openai(key: str, history: list[dict]) -> tuple[str, dict]:
    return f"/v1/gateway/{key}/v1/chat/completions", {
        "model": "policy", "messages": history, "max_tokens": MAX_TOKENS}


def _anthropic(key: str, history: list[dict]) -> tuple[str, dict]:
    return f"/v1/gateway/{key}/v1/messages", {
        "model": "policy", "system": SYSTEM, "messages": history, "max_tokens": MAX_TOKENS}


def _text(wire: str, answer: dict) -> str:
    if wire == "openai":
        return str(answer["choices"][0]["message"]["content"])
    return "".join(b["text"] for b in answer["content"] if b["type"] == "text")


async def gateway_phase(api: httpx.AsyncClient, server: psutil.Process, wire: str,
                        sessions: int, calls: int) -> tuple[list[float], list[list[list[int]]], float]:
    """Latencies (s) of every gateway call, each session's prompts (token ids, in
    order), and the server's CPU seconds per call."""
    tasks = [{"data_source": "gateway", "instance": {"answer": REPLY}} for _ in range(sessions)]
    r = await api.post("/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": MAX_TOKENS},
                                             "agent": {"max_turns": calls + 1,
                                                       "max_context_tokens": 8192}})
    r.raise_for_status()
    ids = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
    keys = []
    for rid in ids:
        info = await api.get(f"/v1/rollouts/{rid}/gateway", params={"wait": 120})
        info.raise_for_status()
        keys.append(info.json()["key"])
    make = _openai if wire == "openai" else _anthropic
    latencies: list[float] = []

    async def harness(client: httpx.AsyncClient, index: int, key: str) -> None:
        history: list[dict] = [{"role": "user", "content": f"Fix issue {index} of the repository."}]
        if wire == "openai":
            history.insert(0, {"role": "system", "content": SYSTEM})
        for turn in range(calls):
            path, body = make(key, history)
            t0 = time.perf_counter()
            answer = await client.post(path, json=body)
            latencies.append(time.perf_counter() - t0)
            answer.raise_for_status()
            history += [{"role": "assistant", "content": _text(wire, answer.json())},
                        {"role": "user", "content": f"Output of step {turn}: ok"}]
        (await client.post(f"/v1/gateway/{key}/end")).raise_for_status()

    # The harnesses' own client, opened now: no connection left idle since the set-up
    # (the server closes idle ones after 5 s).
    async with httpx.AsyncClient(base_url=str(api.base_url), timeout=300, limits=LIMITS) as calls_api:
        cpu = server.cpu_times()
        await asyncio.gather(*(harness(calls_api, i, k) for i, k in enumerate(keys)))
        after = server.cpu_times()
    cpu_s = (after.user + after.system - cpu.user - cpu.system) / (sessions * calls)
    prompts = []
    for rid in ids:
        view = (await api.get(f"/v1/rollouts/{rid}", params={"wait": 120})).json()
        result = view["result"]
        assert result["status"] == "completed" and result["reward"] == 1.0, result["status"]
        trajectory = result["trajectory"]
        assert trajectory["sequence_count"] == 1, "the conversation is append-only"
        sequence: list[int] = []
        session_prompts = []
        for turn in trajectory["turns"]:
            sequence += turn["prompt_ids_delta"]
            session_prompts.append(list(sequence))
            sequence += turn["output_ids"]
        assert sequence == trajectory["tokens"]["input_ids"]
        prompts.append(session_prompts)
    return latencies, prompts, cpu_s


async def direct_phase(llm_url: str, model: str, prompts: list[list[list[int]]]) -> list[float]:
    """The same prompts, straight to the backend: same sessions at once, each in order."""
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    latencies: list[float] = []

    async def session(llm: httpx.AsyncClient, calls: list[list[int]]) -> None:
        for prompt in calls:
            t0 = time.perf_counter()
            answer = await llm.post("/v1/completions", json=completions_body(model, prompt, sampling))
            latencies.append(time.perf_counter() - t0)
            answer.raise_for_status()

    async with httpx.AsyncClient(base_url=llm_url, timeout=300, limits=LIMITS) as llm:
        await asyncio.gather(*(session(llm, p) for p in prompts))
    return latencies


def _ms(values: list[float], q: float) -> float:
    return 1000 * (median(values) if q == 50 else percentile(values, q))


async def measure(api_url: str, llm_url: str, server: psutil.Process,
                  runs: list[tuple[int, int]]) -> list[dict]:
    """Each (sessions, calls) run, through each wire, then direct."""
    out: list[dict] = []
    model = httpx.get(f"{llm_url}/v1/models").json()["data"][0]["id"]
    async with httpx.AsyncClient(base_url=api_url, timeout=300, limits=LIMITS) as api:
        for sessions, calls in runs:
            for wire in ("openai", "anthropic"):
                through, prompts, cpu_s = await gateway_phase(api, server, wire, sessions, calls)
                direct = await direct_phase(llm_url, model, prompts)
                out.append({
                    "wire": wire, "sessions": sessions, "calls": len(through),
                    "server_cpu_ms_per_call": 1000 * cpu_s,
                    "gateway_ms": {"p50": _ms(through, 50), "p99": _ms(through, 99)},
                    "direct_ms": {"p50": _ms(direct, 50), "p99": _ms(direct, 99)},
                    "overhead_ms": {"p50": _ms(through, 50) - _ms(direct, 50),
                                    "p99": _ms(through, 99) - _ms(direct, 99)},
                    "mean_prompt_tokens": sum(len(p) for s in prompts for p in s) / len(through)})
    return out


def main(sessions: int, calls: int, solo_calls: int, latency: float) -> None:
    llm_port, api_port = free_port(), free_port()
    state = state_dir()
    fake = fake_llm(llm_port, latency, REPLY)
    server = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(api_port),
         "--state-dir", state, "--backend", f"http://127.0.0.1:{llm_port}",
         "--init-workers", str(sessions), "--run-workers", str(sessions),
         "--eval-workers", "64", "--max-pending", str(2 * sessions), "--log-level", "warning"])
    try:
        wait_http(f"http://127.0.0.1:{llm_port}/health", fake)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server)
        load_before = psutil.getloadavg()[0]
        data = asyncio.run(measure(f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{llm_port}",
                                   psutil.Process(server.pid), [(1, solo_calls), (sessions, calls)]))
        load_after = psutil.getloadavg()[0]
    finally:
        for proc in (server, fake):
            proc.terminate()
            proc.wait(timeout=30)
    rows = [[d["wire"], d["sessions"], d["calls"],
             f"{d['direct_ms']['p50']:.1f} / {d['direct_ms']['p99']:.1f}",
             f"{d['gateway_ms']['p50']:.1f} / {d['gateway_ms']['p99']:.1f}",
             f"{d['overhead_ms']['p50']:.1f} / {d['overhead_ms']['p99']:.1f}",
             f"{d['server_cpu_ms_per_call']:.1f}"] for d in data]
    report("gateway_overhead",
           f"gateway overhead per call: 1 session x {solo_calls} calls, {sessions} concurrent "
           f"sessions x {calls} calls; test-double vLLM at {latency * 1000:.0f} ms/call",
           ["wire", "sessions", "calls", "direct p50 / p99 ms", "gateway p50 / p99 ms",
            "overhead p50 / p99 ms", "server CPU ms / call"], rows,
           {"config": {"sessions": sessions, "calls_per_session": calls,
                       "solo_session_calls": solo_calls, "llm_latency_s": latency,
                       "reply": REPLY, "max_tokens": MAX_TOKENS, "cores": psutil.cpu_count(),
                       "load_average_before_after": [load_before, load_after],
                       "gateway": "rollserve serve, its own process",
                       "backend": "rollserve.testing.fake_vllm, its own process"},
            "results": data})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5, help="calls per session (of --sessions)")
    parser.add_argument("--solo-calls", type=int, default=40, help="calls of the one-session run")
    parser.add_argument("--latency", type=float, default=0.5)
    args = parser.parse_args()
    main(args.sessions, args.calls, args.solo_calls, args.latency)

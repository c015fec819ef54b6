"""The gateway's added latency and server CPU per model call, on each wire a preset uses.

Part of ``benchmarks/harness_overhead.py`` (the table's second half). The backend
double (``TimedVLLM``: the test-double vLLM, ``--latency`` seconds per call, a fixed
short reply) runs as its own process and records, for every call it serves, when its
handler got the request and when it had the answer (``time.perf_counter``: the
system's monotonic clock, the same in every process of the machine). This process
plays the harnesses: N `gateway` rollouts at once, each a session making ``calls``
calls back to back (a growing conversation, no SDK: raw JSON), through Chat
Completions, Responses or Anthropic Messages, not streamed.

Then every prompt the gateway sent (its token ids, from the rollouts' trajectories) is
replayed straight to the backend (``/v1/completions``, the body rollserve's vLLM
backend sends), the same sessions at once, each in order. Each gateway call is paired
with its own replay, and the percentiles are of the per-call differences:

- ``paired``: (gateway call, as this client timed it) - (its direct replay, as this
  client timed it): what a harness outside the sandbox pays for the gateway,
  backend jitter included.
- ``at_gateway``: the same difference with each side's own backend time taken off
  first: [(gateway call) - (the backend's handling of the gateway's call)] -
  [(replay) - (the backend's handling of the replay)]. The backend's sleep and its
  jitter cancel exactly; what is left is what the gateway adds: the client's request
  to the server and the answer back on top of a direct call's, the server's parsing,
  rendering and tokenizing, its own client call to the backend, the recording.
- ``at_gateway`` in two sections, on the machine's one monotonic clock: ``before_backend``
  (sent -> the backend's handler has the request, less the replay's: the request read
  and parsed, converted, the prompt rendered and tokenized, the server's own request to
  the backend) and ``after_backend`` (the backend's answer -> the client has the
  gateway's, less the replay's: the backend's answer read, the reply detokenized and
  parsed, the turn recorded, the answer rendered and sent).
- server CPU per call: the server process's CPU over the calls (and the sessions'
  ends) divided by the calls.

Run alone, it writes ``results/gateway_wires.json`` (1 session of ``--solo-calls``, then
``--sessions`` at once of ``--calls`` each, per wire); with ``--port`` it is only the
backend double (as ``harness_overhead.py`` and ``gateway_ab.py`` start it).

    python -m benchmarks.gateway_wires [--solo-calls 40] [--sessions 20] [--calls 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import psutil
from aiohttp import web

from benchmarks.common import free_port, median, percentile, report, state_dir, wait_http
from rollserve.contract import SamplingParams
from rollserve.llm.backends.vllm import completions_body
from rollserve.testing import FakeVLLM

REPLY = "I will look at the repository first."
SYSTEM = "You are a coding agent."
MAX_TOKENS = 32
WIRES = ("chat", "responses", "anthropic")
# Idle connections dropped after 1 s, well before uvicorn closes them (5 s).
LIMITS = httpx.Limits(max_connections=500, max_keepalive_connections=500, keepalive_expiry=1.0)
SRC = Path(__file__).resolve().parents[1] / "src"


class TimedVLLM(FakeVLLM):
    """The test double, plus ``GET /bench/calls``: each call's prompt ids and the
    backend's own time on it (handler start to answer ready)."""

    def routes(self, app: web.Application) -> None:
        super().routes(app)
        app.router.add_get("/bench/calls", self._timings)

    async def _timings(self, request: web.Request) -> web.Response:
        start = int(request.query.get("from", "0"))
        return web.json_response([
            {"prompt_ids": c.prompt_ids, "received": c.received_at, "finished": c.finished_at}
            for c in self.calls[start:] if c.route == "/v1/completions"])


def _request(wire: str, key: str, history: list[dict]) -> tuple[str, dict]:
    base = f"/v1/gateway/{key}"
    if wire == "chat":
        return f"{base}/v1/chat/completions", {
            "model": "policy", "messages": [{"role": "system", "content": SYSTEM}, *history],
            "max_tokens": MAX_TOKENS}
    if wire == "responses":
        return f"{base}/v1/responses", {"model": "policy", "instructions": SYSTEM,
                                         "input": history, "max_output_tokens": MAX_TOKENS}
    return f"{base}/v1/messages", {"model": "policy", "system": SYSTEM, "messages": history,
                                   "max_tokens": MAX_TOKENS}


def _text(wire: str, answer: dict) -> str:
    if wire == "chat":
        return str(answer["choices"][0]["message"]["content"])
    if wire == "responses":
        return "".join(part["text"] for item in answer["output"] if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")
    return "".join(b["text"] for b in answer["content"] if b["type"] == "text")


async def _backend_times(llm: httpx.AsyncClient, start: int
                         ) -> dict[tuple[int, ...], list[tuple[float, float]]]:
    """When the backend got each call since call ``start`` and when it had the answer,
    by prompt (in order)."""
    out: dict[tuple[int, ...], list[tuple[float, float]]] = defaultdict(list)
    for c in (await llm.get("/bench/calls", params={"from": start})).json():
        out[tuple(c["prompt_ids"])].append((c["received"], c["finished"]))
    return out


async def _open(api: httpx.AsyncClient, sessions: int, calls: int) -> tuple[list[str], list[str]]:
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
    return ids, keys


async def _prompts(api: httpx.AsyncClient, ids: list[str]) -> list[list[list[int]]]:
    """Each session's prompts (token ids, in order), from its trajectory."""
    out = []
    for rid in ids:
        result = (await api.get(f"/v1/rollouts/{rid}", params={"wait": 120})).json()["result"]
        if result["status"] != "completed" or result["trajectory"]["sequence_count"] != 1:
            raise RuntimeError(f"rollout {rid}: {result['status']}, {result['failure']}")
        sequence: list[int] = []
        session = []
        for turn in result["trajectory"]["turns"]:
            sequence += turn["prompt_ids_delta"]
            session.append(list(sequence))
            sequence += turn["output_ids"]
        out.append(session)
    return out


async def run_wire(api_url: str, llm_url: str, server: psutil.Process, wire: str,
                   sessions: int, calls: int) -> dict:
    """``sessions`` at once through ``wire``, then the direct replay; the paired numbers."""
    async with httpx.AsyncClient(base_url=api_url, timeout=300) as api, \
            httpx.AsyncClient(base_url=llm_url, timeout=300, limits=LIMITS) as llm:
        ids, keys = await _open(api, sessions, calls)
        mark = len((await llm.get("/bench/calls")).json())
        through: list[list[tuple[float, float]]] = [[] for _ in keys]  # (sent, answered)

        async def harness(client: httpx.AsyncClient, index: int, key: str) -> None:
            history: list[dict] = [{"role": "user", "content": f"Fix issue {index} of the repository."}]
            for turn in range(calls):
                path, body = _request(wire, key, history)
                t0 = time.perf_counter()
                answer = await client.post(path, json=body)
                through[index].append((t0, time.perf_counter()))
                answer.raise_for_status()
                history += [{"role": "assistant", "content": _text(wire, answer.json())},
                            {"role": "user", "content": f"Output of step {turn}: ok"}]
            (await client.post(f"/v1/gateway/{key}/end")).raise_for_status()

        async with httpx.AsyncClient(base_url=api_url, timeout=300, limits=LIMITS) as harnesses:
            cpu, load = server.cpu_times(), psutil.getloadavg()[0]
            await asyncio.gather(*(harness(harnesses, i, k) for i, k in enumerate(keys)))
            after = server.cpu_times()
        gateway_backend = await _backend_times(llm, mark)
        prompts = await _prompts(api, ids)
        mark = len((await llm.get("/bench/calls")).json())
        model = (await llm.get("/v1/models")).json()["data"][0]["id"]
        sampling = SamplingParams(max_tokens=MAX_TOKENS)
        direct: list[list[tuple[float, float]]] = [[] for _ in prompts]

        async def replay(index: int) -> None:
            for prompt in prompts[index]:
                t0 = time.perf_counter()
                answer = await llm.post("/v1/completions", json=completions_body(model, prompt, sampling))
                direct[index].append((t0, time.perf_counter()))
                answer.raise_for_status()

        await asyncio.gather(*(replay(i) for i in range(len(prompts))))
        direct_backend = await _backend_times(llm, mark)
    paired, at_gateway, to_backend, from_backend = [], [], [], []
    for s, session in enumerate(prompts):
        for c, prompt in enumerate(session):
            key = tuple(prompt)
            (g_sent, g_done), (d_sent, d_done) = through[s][c], direct[s][c]
            (g_in, g_out), (d_in, d_out) = gateway_backend[key].pop(0), direct_backend[key].pop(0)
            paired.append(1000 * ((g_done - g_sent) - (d_done - d_sent)))
            # The machine's one monotonic clock: the request's way to the backend
            # (sent -> the backend's handler has it) and the answer's way back.
            to_backend.append(1000 * ((g_in - g_sent) - (d_in - d_sent)))
            from_backend.append(1000 * ((g_done - g_out) - (d_done - d_out)))
            at_gateway.append(to_backend[-1] + from_backend[-1])
    n = sessions * calls
    flat_through = [done - sent for s in through for sent, done in s]
    flat_direct = [done - sent for s in direct for sent, done in s]
    return {"wire": wire, "sessions": sessions, "calls": n, "load_average": load,
            "gateway_ms": _p(flat_through, 1000), "direct_ms": _p(flat_direct, 1000),
            "added_paired_ms": _p(paired), "added_at_gateway_ms": _p(at_gateway),
            "added_before_backend_ms": _p(to_backend), "added_after_backend_ms": _p(from_backend),
            "server_cpu_ms_per_call": 1000 * (after.user + after.system - cpu.user - cpu.system) / n,
            "mean_prompt_tokens": sum(len(p) for s in prompts for p in s) / n,
            "_per_call": {"paired": paired, "at_gateway": at_gateway}}


def _p(values: list[float], scale: float = 1.0) -> dict:
    return {"p50": scale * median(values), "p99": scale * percentile(values, 99)}


async def measure(api_url: str, llm_url: str, server: psutil.Process,
                  runs: list[tuple[int, int]]) -> list[dict]:
    """Each (sessions, calls) run through each wire; a first short warm-up is dropped."""
    await run_wire(api_url, llm_url, server, "chat", 1, 3)
    return [await run_wire(api_url, llm_url, server, wire, sessions, calls)
            for sessions, calls in runs for wire in WIRES]


def _hidden(modules: list[str]) -> list[str]:
    """A folder (as a one-entry list, or none) whose packages ``modules`` raise ``ImportError``."""
    if not modules:
        return []
    folder = Path(state_dir("rollserve-bench-hide-"))
    for name in modules:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by the benchmark')\n")
    return [str(folder)]


def server(src: Path, port: int, backend: str, hide: list[str] | None = None) -> subprocess.Popen:
    """``rollserve serve`` of the tree ``src`` on ``port``, its backend ``backend``; the
    modules ``hide`` (e.g. httptools, uvloop) made unimportable for it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*_hidden(hide or []), str(src), str(SRC.parent)])}
    return subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(port), "--state-dir",
         state_dir(), "--backend", backend, "--log-level", "warning"],
        env=env)


def _pq(d: dict) -> str:
    return f"{d['p50']:.2f} / {d['p99']:.2f}"


def table(args: argparse.Namespace) -> None:
    """The table: this tree's server and the backend double, each its own process."""
    llm_port, port = free_port(), free_port()
    llm = subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_wires", "--port", str(llm_port),
                            "--latency", str(args.latency)])
    llm_url = f"http://127.0.0.1:{llm_port}"
    proc = server(SRC, port, llm_url)
    load = [psutil.getloadavg()[0]]
    try:
        wait_http(f"{llm_url}/health", llm)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        probe = subprocess.run([sys.executable, "-c", "import uvicorn.config as c, uvicorn.loops.auto as a;"
                                "from uvicorn.protocols.http.auto import AutoHTTPProtocol as P;"
                                "print(P.__name__, a.auto_loop_factory().__module__)"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        wires = asyncio.run(measure(f"http://127.0.0.1:{port}", llm_url, psutil.Process(proc.pid),
                                    [(1, args.solo_calls), (args.sessions, args.calls)]))
    finally:
        for p in (proc, llm):
            p.terminate()
            p.wait(timeout=60)
    load.append(psutil.getloadavg()[0])
    for d in wires:
        d.pop("_per_call")
    rows = [[d["wire"], d["sessions"], d["calls"], f"{d['load_average']:.1f}", _pq(d["direct_ms"]),
             _pq(d["gateway_ms"]), _pq(d["added_paired_ms"]), _pq(d["added_at_gateway_ms"]),
             f"{d['added_before_backend_ms']['p50']:.2f}", f"{d['added_after_backend_ms']['p50']:.2f}",
             f"{d['server_cpu_ms_per_call']:.2f}"] for d in wires]
    report("gateway_wires", f"the gateway per call, per wire; backend double at {args.latency * 1000:.0f} ms/call",
           ["wire", "sessions", "calls", "load avg", "direct p50 / p99 ms", "gateway p50 / p99 ms",
            "added, paired (p50 / p99) ms", "added, at the gateway (p50 / p99) ms",
            "of which before the backend p50 ms", "of which after the backend p50 ms", "server CPU ms/call"],
           rows, {"config": {"solo_calls": args.solo_calls, "sessions": args.sessions,
                             "calls_per_session": args.calls, "llm_latency_s": args.latency,
                             "max_tokens": MAX_TOKENS, "cores": psutil.cpu_count(),
                             "load_average_start_end": load,
                             "http_parser_and_loop": probe.stdout.strip(),
                             "server": "rollserve serve of this tree, its own process",
                             "backend": "benchmarks.gateway_wires.TimedVLLM, its own process"},
                  "results": wires})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_wires", description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--port", type=int, help="only serve the backend double on this port")
    parser.add_argument("--latency", type=float, default=0.1, help="backend seconds per call")
    parser.add_argument("--solo-calls", type=int, default=40, help="calls of the one session, per wire")
    parser.add_argument("--sessions", type=int, default=20, help="sessions at once, per wire")
    parser.add_argument("--calls", type=int, default=5, help="calls per session of --sessions")
    args = parser.parse_args()
    if args.port is None:
        table(args)
        return
    backend = TimedVLLM(replies=[REPLY], latency=args.latency, port=args.port)

    async def serve() -> None:
        async with backend:
            await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

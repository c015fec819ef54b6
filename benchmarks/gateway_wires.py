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
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import httpx
import psutil
from aiohttp import web

from benchmarks.common import median, percentile
from rollserve.contract import SamplingParams
from rollserve.llm.backends.vllm import completions_body
from rollserve.testing import FakeVLLM

REPLY = "I will look at the repository first."
SYSTEM = "You are a coding agent."
MAX_TOKENS = 32
WIRES = ("chat", "responses", "anthropic")
# Idle connections dropped after 1 s, well before uvicorn closes them (5 s).
LIMITS = httpx.Limits(max_connections=500, max_keepalive_connections=500, keepalive_expiry=1.0)


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


async def _backend_times(llm: httpx.AsyncClient, start: int) -> dict[tuple[int, ...], list[float]]:
    """The backend's own seconds on each call since call ``start``, by prompt (in order)."""
    out: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for c in (await llm.get("/bench/calls", params={"from": start})).json():
        out[tuple(c["prompt_ids"])].append(c["finished"] - c["received"])
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
        through: list[list[float]] = [[] for _ in keys]

        async def harness(client: httpx.AsyncClient, index: int, key: str) -> None:
            history: list[dict] = [{"role": "user", "content": f"Fix issue {index} of the repository."}]
            for turn in range(calls):
                path, body = _request(wire, key, history)
                t0 = time.perf_counter()
                answer = await client.post(path, json=body)
                through[index].append(time.perf_counter() - t0)
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
        direct: list[list[float]] = [[] for _ in prompts]

        async def replay(index: int) -> None:
            for prompt in prompts[index]:
                t0 = time.perf_counter()
                answer = await llm.post("/v1/completions", json=completions_body(model, prompt, sampling))
                direct[index].append(time.perf_counter() - t0)
                answer.raise_for_status()

        await asyncio.gather(*(replay(i) for i in range(len(prompts))))
        direct_backend = await _backend_times(llm, mark)
    paired, at_gateway = [], []
    for s, session in enumerate(prompts):
        for c, prompt in enumerate(session):
            key = tuple(prompt)
            paired.append(1000 * (through[s][c] - direct[s][c]))
            at_gateway.append(1000 * ((through[s][c] - gateway_backend[key].pop(0))
                                      - (direct[s][c] - direct_backend[key].pop(0))))
    n = sessions * calls
    flat_through = [x for s in through for x in s]
    flat_direct = [x for s in direct for x in s]
    return {"wire": wire, "sessions": sessions, "calls": n, "load_average": load,
            "gateway_ms": _p(flat_through, 1000), "direct_ms": _p(flat_direct, 1000),
            "added_paired_ms": _p(paired), "added_at_gateway_ms": _p(at_gateway),
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_wires",
                                     description="the backend double with its call timings")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    server = TimedVLLM(replies=[REPLY], latency=args.latency, port=args.port)

    async def serve() -> None:
        async with server:
            await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

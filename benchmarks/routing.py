"""Routing policies on unequal backends: 400 multi-turn trajectories, one slow server.

Four test-double vLLM servers (own process), each with ``capacity`` slots; three
answer a call in ``latency`` s, one in 4x that. 400 trajectories start at once, each
``turns`` calls long with a short tool step between calls, every call through the
router (sticky sessions). Policies:

- least_load (rollserve): least expected wait, (outstanding + 1) x measured unit
  cost; a trajectory leaves its backend only when that is clearly the worse place;
- least_outstanding: fewest requests in flight at a trajectory's start, then sticky;
- prorl_cumulative: ProRL Agent's min-heap of assignments ever made, sticky;
- round_robin and hash_sticky.

rollserve's policy runs two batches on one router: "cold" (no measurements yet) and
"warm" (the next training step: what the router learned in the first batch is
kept). The baselines learn nothing from a batch, so they run one (``--warm-baselines``
runs them twice too).
Ideal: every slot of every server busy until the last call, i.e. makespan =
calls / sum(capacity / latency). Reports throughput, % of ideal, p50/p99
trajectory time and the share of calls the slow server took (ideal: its share of
capacity).

    python -m benchmarks.routing [--trajectories 400] [--turns 8] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from benchmarks.common import median, percentile, report
from benchmarks.fake_fleet import FakeFleet
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.policies import make_policy
from rollserve.llm.routing.router import Router

POLICIES = ["least_load", "least_outstanding", "prorl_cumulative", "round_robin", "hash_sticky"]
SAMPLING = SamplingParams(max_tokens=8)


async def trajectory(router: Router, key: str, turns: int, tool_s: float, rng: random.Random,
                     served: dict[str, int]) -> float:
    started = time.perf_counter()
    session = router.session(key)
    prompt = [1, 9690, 198] + [rng.randrange(200, 40000) for _ in range(24)]
    for turn in range(turns):
        gen = await session.generate(prompt, SAMPLING)
        served[gen.backend] = served.get(gen.backend, 0) + 1
        prompt = prompt + gen.output_ids + [rng.randrange(200, 40000) for _ in range(8)]
        if turn < turns - 1:
            await asyncio.sleep(tool_s * rng.uniform(0.5, 1.5))
    session.close()
    return time.perf_counter() - started


async def batch(router: Router, n: int, turns: int, tool_s: float, seed: int, tag: str) -> dict:
    rng = random.Random(seed)
    served: dict[str, int] = {}
    started = time.perf_counter()
    durations = await asyncio.gather(*[
        trajectory(router, f"{tag}-{i}", turns, tool_s, random.Random(rng.random()), served)
        for i in range(n)])
    makespan = time.perf_counter() - started
    return {"makespan": makespan, "durations": durations, "served": served}


async def run_policy(policy: str, urls: list[str], args: argparse.Namespace) -> list[dict]:
    router = Router(policy=make_policy(policy))
    for i, url in enumerate(urls):
        router.add(VLLMBackend(url, name=f"b{i}", model="fake-model"))
    out = []
    phases = ("cold", "warm") if policy == "least_load" or args.warm_baselines else ("cold",)
    for phase in phases:
        out.append({"policy": policy, "phase": phase,
                    **await batch(router, args.trajectories, args.turns, args.tool_s,
                                  seed=7 if phase == "cold" else 8, tag=f"{policy}-{phase}"),
                    "moves": router.counters["moves"]})
    await router.stop()
    return out


async def main_async(args: argparse.Namespace) -> None:
    latencies = [args.latency] * 3 + [args.latency * args.slowdown]
    servers = [{"latency": lat, "capacity": args.capacity} for lat in latencies]
    rate = sum(args.capacity / lat for lat in latencies)  # calls per second, all busy
    calls = args.trajectories * args.turns
    ideal_makespan = calls / rate
    slow_share_ideal = (args.capacity / latencies[-1]) / rate
    rows, runs = [], []
    with FakeFleet(servers) as fleet:
        for policy in args.policies:
            for run in await run_policy(policy, fleet.urls, args):
                durations = run["durations"]
                slow = run["served"].get("b3", 0) / calls
                throughput = args.trajectories / run["makespan"]
                rows.append([policy, run["phase"], round(run["makespan"], 3), round(throughput, 1),
                             f"{100 * ideal_makespan / run['makespan']:.1f}%",
                             round(median(durations), 3), round(percentile(durations, 99), 3),
                             f"{100 * slow:.1f}%"])
                runs.append({"policy": policy, "phase": run["phase"], "makespan_s": run["makespan"],
                             "trajectories_per_s": throughput, "calls_per_s": calls / run["makespan"],
                             "of_ideal": ideal_makespan / run["makespan"],
                             "p50_s": median(durations), "p99_s": percentile(durations, 99),
                             "served": run["served"], "moves_so_far": run["moves"]})
    rows.append(["ideal", "", round(ideal_makespan, 3), round(args.trajectories / ideal_makespan, 1),
                 "100%", "", "", f"{100 * slow_share_ideal:.1f}%"])
    report(
        "routing",
        f"{args.trajectories} trajectories x {args.turns} turns, 4 backends x {args.capacity} "
        f"slots, latency {args.latency}s (one {args.slowdown:g}x slower)",
        ["policy", "batch", "makespan s", "traj/s", "of ideal", "p50 s", "p99 s", "slow's share"],
        rows,
        {"config": vars(args), "ideal": {"makespan_s": ideal_makespan, "calls_per_s": rate,
                                         "slow_share": slow_share_ideal}, "runs": runs},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=400)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per call, fast servers")
    parser.add_argument("--slowdown", type=float, default=4.0)
    parser.add_argument("--capacity", type=int, default=8, help="slots per server")
    parser.add_argument("--tool-s", type=float, default=0.01, help="tool step between calls")
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--warm-baselines", action="store_true",
                        help="run the baselines for two batches too")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

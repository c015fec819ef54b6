"""Staged pools vs a coupled worker loop, same tasks and same LLM.

The LLM is the scarce resource: a test-double vLLM with ``capacity`` slots (like a
GPU's batch) and a fixed latency per call. Evaluation is slow (uniform 2-5 s, as
when hidden tests run in a sandbox) and set-up takes a little time.

- coupled: W workers, each doing init → run → eval in sequence for one rollout at a
  time (what in-trainer loops do). The LLM sees at most the workers that happen to
  be in their agent loop.
- rollserve: the real engine with W RUN slots (the same agent-loop concurrency) and
  INIT/EVAL in their own pools, so a rollout in evaluation never holds a RUN slot.
- coupled ×k: the coupled loop given as many workers as rollserve's pools together,
  to show what it costs the coupled design to catch up (each worker holds its
  sandbox and LLM session for the whole rollout).

Reports throughput (rollouts/s) and LLM utilization (slot-seconds used / capacity).

    python -m benchmarks.pipeline_vs_coupled [--rollouts 160] [--workers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import report
from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.rollout import Rollout, RolloutSpec, Timeouts
from rollserve.engine.store import SQLiteStore
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.math import MathHandler
from rollserve.handlers.registry import HandlerRegistry
from rollserve.handlers.scoring import ScoringPool
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.testing import FakeVLLM


class SlowMath(MathHandler):
    """The math handler with a sandbox-like set-up and a slow, test-like evaluation."""

    name = "slow_math"
    init_seconds = 0.1
    eval_range = (2.0, 5.0)

    async def init(self, rollout: Rollout) -> None:
        await asyncio.sleep(self.init_seconds)
        await super().init(rollout)

    async def eval(self, rollout: Rollout):
        rng = random.Random(rollout.id)  # the same delay for a rollout in every mode
        await asyncio.sleep(rng.uniform(*self.eval_range))
        return await super().eval(rollout)


def generation_utilization(fake: FakeVLLM, since_call: int, capacity: int) -> float:
    """Slot-seconds used / capacity over [first call starts, last call ends]: how
    busy the LLM was while there was still generation to do (excludes the tail of
    evaluations after the last LLM call, which no scheduler can fill)."""
    calls = [c for c in fake.calls[since_call:] if c.started_at and c.finished_at]
    if not calls:
        return 0.0
    window = max(c.finished_at for c in calls) - min(c.started_at for c in calls)
    used = sum(c.finished_at - c.started_at for c in calls)
    return used / (window * capacity)


def specs(count: int) -> list[RolloutSpec]:
    return [
        RolloutSpec(id=f"r{i}", group_id=f"g{i // 4}", task_id=f"t{i // 4}",
                    data_source="slow_math", sample_index=i % 4,
                    instance={"question": f"What is {i} + {i}?", "answer": str(2 * i)},
                    sampling=SamplingParams(max_tokens=64))
        for i in range(count)
    ]


async def run_coupled(handler: SlowMath, router: Router, count: int, workers: int) -> float:
    queue: asyncio.Queue[RolloutSpec] = asyncio.Queue()
    for spec in specs(count):
        queue.put_nowait(spec)

    async def worker() -> None:
        while not queue.empty():
            spec = queue.get_nowait()
            rollout = Rollout(spec=spec, max_turns=3, max_context_tokens=2048,
                              timeouts=Timeouts(init=60, run=60, eval=60, total=600))
            await handler.init(rollout)
            rollout.llm = router.session(rollout.id)
            await handler.run(rollout)
            await handler.eval(rollout)
            await handler.cleanup(rollout)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.perf_counter() - started


async def run_staged(registry: HandlerRegistry, ctx: HandlerContext, router: Router, count: int,
                     workers: int, eval_workers: int, db: Path) -> float:
    store = SQLiteStore(db)
    await store.open()
    engine = Engine(store, registry, router,
                    EngineConfig(init_workers=workers, run_workers=workers,
                                 eval_workers=eval_workers, max_pending=count), ctx)
    await engine.start()
    all_specs = specs(count)
    started = time.perf_counter()
    from rollserve.engine.store import GroupRow

    groups: dict[str, list[RolloutSpec]] = {}
    for spec in all_specs:
        groups.setdefault(spec.group_id, []).append(spec)
    await store.create_groups([(GroupRow(g, s[0].task_id, None, "h", len(s), time.time()), s)
                               for g, s in groups.items()])
    engine.launch(all_specs)
    await engine.wait_finished([s.id for s in all_specs], timeout=3600)
    elapsed = time.perf_counter() - started
    counts = await store.counts()
    await engine.stop()
    await store.close()
    assert counts == {"completed": count}, counts
    return elapsed


async def main(rollouts: int, workers: int, latency: float, eval_factor: int) -> None:
    tokenizer = ChatTokenizer.load("smollm2")
    # Two turns per episode: a reply without a boxed answer, then one with it.
    fake = FakeVLLM(tokenizer, replies=["Let me add the numbers first.", "So it is \\boxed{2}."],
                    latency=latency, capacity=workers).start_in_thread()
    scoring = ScoringPool(workers=2)
    await scoring.astart()
    ctx = HandlerContext(tokenizer=tokenizer, scoring=scoring)
    registry = HandlerRegistry(discover=False)
    registry.register("slow_math", SlowMath)
    handler = registry.create("slow_math", ctx)
    router = Router()
    router.add(VLLMBackend(fake.url, name="fake"))
    eval_workers = workers * eval_factor
    modes = [
        ("coupled", workers, lambda: run_coupled(handler, router, rollouts, workers)),
        ("rollserve", f"{workers}/{workers}/{eval_workers}",
         lambda: run_staged(registry, ctx, router, rollouts, workers, eval_workers,
                            Path(tempfile.mkdtemp()) / "bench.db")),
        (f"coupled x{2 + eval_factor}", workers * (2 + eval_factor),
         lambda: run_coupled(handler, router, rollouts, workers * (2 + eval_factor))),
    ]
    rows, data = [], {}
    try:
        for name, concurrency, run in modes:
            fake.reset_stats()
            first_call = len(fake.calls)
            elapsed = await run()
            stats = fake.stats()
            throughput = rollouts / elapsed
            generating = generation_utilization(fake, first_call, workers)
            data[name] = {"seconds": elapsed, "throughput": throughput,
                          "llm_utilization_overall": stats["utilization"],
                          "llm_utilization_while_generating": generating}
            rows.append([name, str(concurrency), rollouts, round(elapsed, 2), round(throughput, 3),
                         round(stats["utilization"], 3), round(generating, 3)])
    finally:
        await scoring.aclose()
        for backend in router.list():
            await router.remove(backend["name"])
        fake.stop()
    ratio = data["rollserve"]["throughput"] / data["coupled"]["throughput"]
    rows.append(["rollserve / coupled", "", "", "", round(ratio, 2), "", ""])
    report(
        "pipeline_vs_coupled",
        f"Staged pools vs coupled loop (LLM {workers} slots, {latency}s/call, eval 2-5 s)",
        ["mode", "workers (init/run/eval)", "rollouts", "seconds", "rollouts/s",
         "LLM util. overall", "LLM util. while generating"],
        rows,
        {"config": {"rollouts": rollouts, "workers": workers, "llm_latency_s": latency,
                    "llm_capacity": workers, "eval_seconds": [2.0, 5.0], "init_seconds": 0.1,
                    "turns_per_rollout": 2},
         "results": data, "throughput_ratio": ratio,
         "targets": {"throughput_ratio": ">= 1.5", "llm_utilization": ">= 0.9"}},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=160)
    parser.add_argument("--workers", type=int, default=8, help="agent loops = LLM slots")
    parser.add_argument("--latency", type=float, default=0.3, help="seconds per LLM call")
    parser.add_argument("--eval-factor", type=int, default=8, help="EVAL pool = workers x this")
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.workers, args.latency, args.eval_factor))

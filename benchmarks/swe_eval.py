"""SWE handler stages on the bundled swe-mini suite, in bubblewrap: the repository
materialised from its bundle (INIT's sandbox work), and EVAL of the gold patch (a fresh
sandbox, the repository again, the candidate and test patches applied, the tests run
and graded with swebench's parser). Rounds run one after another: latencies of one.

    python -m benchmarks.swe_eval [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import median, percentile, report
from rollserve.datasets import SWE_MINI
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.sandboxed import close_sandboxes
from rollserve.handlers.swe import SWEHandler
from rollserve.handlers.swe.handler import SWECandidate
from rollserve.handlers.swe.patch import Candidate
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.sandbox.registry import LazyRuntime


def stats(name: str, seconds: list[float]) -> list[list]:
    return [[f"{name} ms, mean", round(1000 * statistics.fmean(seconds), 1)],
            [f"{name} ms, median", round(1000 * median(seconds), 1)],
            [f"{name} ms, p95", round(1000 * percentile(seconds, 95), 1)]]


async def main(rounds: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="rollserve-swe-eval-"))
    handler = SWEHandler(HandlerContext(tokenizer=ChatTokenizer.load("smollm2"), scoring=None,
                                        sandboxes=LazyRuntime("bubblewrap", state)))
    init, evals, tests = [], [], 0
    rows = SWE_MINI.rows()
    for n in range(rounds):
        for row in rows:
            spec = RolloutSpec(id=f"{row['instance_id']}-{n}", group_id="g", task_id=row["instance_id"],
                               data_source="swe", sample_index=0, instance=row)
            rollout = Rollout(spec=spec)
            started = time.perf_counter()
            try:
                await handler.init(rollout)
                init.append(time.perf_counter() - started)
                await close_sandboxes(rollout)
                rollout.state = SWECandidate(handler.task(row), Candidate(patch=row["patch"]))
                started = time.perf_counter()
                evaluation = await handler.eval(rollout)
                evals.append(time.perf_counter() - started)
            finally:
                await handler.cleanup(rollout)
            assert evaluation.reward == 1.0, (row["instance_id"], evaluation.details)
            tests += len(evaluation.details["tests"])
    await handler.ctx.sandboxes.aclose()
    table = [["instances", len(rows)], ["rounds", rounds],
             ["graded tests per eval (mean)", round(tests / len(evals), 1)],
             *stats("INIT (sandbox + repository at base_commit)", init),
             *stats("EVAL of the gold patch (resolved)", evals)]
    report("swe_eval", "SWE handler on swe-mini: INIT and EVAL per rollout (bubblewrap)",
           ["measure", "value"], table,
           {"config": {"rounds": rounds, "instances": len(rows)},
            "results": {"init_seconds": init, "eval_seconds": evals, "tests": tests}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args().rounds))

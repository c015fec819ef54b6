"""Hidden-test evaluation of the code handler: wall time per rollout's EVAL stage.

Each bundled task's reference solution (kept in tests/handlers/code_references.py,
never shipped to the agent) is evaluated through the real handler: a fresh
bubblewrap sandbox holding only the solution file, every hidden test run with its
limits. Rounds run one after another, so the figure is the latency of one eval.

    python -m benchmarks.code_eval [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tests.handlers.code_references import REFERENCE

from benchmarks.common import median, percentile, report
from rollserve.datasets import bundled_rows
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.code.handler import CodeHandler, CodeSolution
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.sandbox.registry import LazyRuntime


async def main(rounds: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="rollserve-code-eval-"))
    handler = CodeHandler(HandlerContext(tokenizer=ChatTokenizer.load("smollm2"), scoring=None,
                                         sandboxes=LazyRuntime("bubblewrap", state)))
    seconds: list[float] = []
    tests_run = 0
    for n in range(rounds):
        for row in bundled_rows("code"):
            instance = {k: v for k, v in row.items() if k != "task_id"}
            spec = RolloutSpec(id=f"{row['task_id']}-{n}", group_id="g", task_id=row["task_id"],
                               data_source="code", sample_index=0, instance=instance)
            rollout = Rollout(spec=spec)
            rollout.state = CodeSolution("solution.py", REFERENCE[row["task_id"]])
            started = time.perf_counter()
            try:
                evaluation = await handler.eval(rollout)
            finally:
                await handler.cleanup(rollout)
            seconds.append(time.perf_counter() - started)
            assert evaluation.reward == 1.0, (row["task_id"], evaluation.details)
            tests_run += evaluation.details["total"]
    await handler.ctx.sandboxes.aclose()
    per_test = sum(seconds) / tests_run
    rows = [["evals", len(seconds)], ["hidden tests per eval (mean)", round(tests_run / len(seconds), 2)],
            ["eval ms, mean", round(1000 * statistics.fmean(seconds), 1)],
            ["eval ms, median", round(1000 * median(seconds), 1)],
            ["eval ms, p95", round(1000 * percentile(seconds, 95), 1)],
            ["ms per hidden test (sandbox start included)", round(1000 * per_test, 1)]]
    report("code_eval", "Code handler: hidden-test evaluation per rollout (bubblewrap)",
           ["measure", "value"], rows,
           {"config": {"rounds": rounds, "tasks": len(bundled_rows("code"))},
            "results": {"seconds": seconds, "tests_run": tests_run}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))

"""The bundled code tasks (data/code_tasks.jsonl): valid, and each one's hidden tests
accept its reference solution and reject a stub and a plausible wrong solution,
through the handler's real evaluation in a bubblewrap sandbox."""

from __future__ import annotations

import asyncio

import pytest

from rollserve.datasets import bundled_rows
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.code.handler import CodeHandler, CodeSolution
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.registry import LazyRuntime
from tests.handlers.code_references import REFERENCE, WRONG

TASKS = {row["task_id"]: row for row in bundled_rows("code")}


def instance_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "task_id"}


def test_the_set_is_small_mixed_and_valid(tokenizer):
    handler = CodeHandler(HandlerContext(tokenizer=tokenizer, scoring=None))
    assert len(TASKS) == len(bundled_rows("code")) >= 12  # ids are unique
    styles = [("tests" in row) for row in TASKS.values()]
    assert sum(styles) >= 5 and len(styles) - sum(styles) >= 5  # stdin/stdout and asserts
    for row in TASKS.values():
        handler.validate(instance_of(row))
    assert set(REFERENCE) == set(WRONG) == set(TASKS)


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
@pytest.mark.parametrize("task_id", sorted(TASKS))
async def test_reference_passes_and_wrong_solutions_fail(task_id, tokenizer, new_rollout, tmp_path):
    handler = CodeHandler(
        HandlerContext(tokenizer=tokenizer, scoring=None, sandboxes=LazyRuntime("bubblewrap", tmp_path / "state"))
    )
    instance = instance_of(TASKS[task_id])
    stub = instance.get("starter_code") or "pass\n"
    # The wrong ones may be slow as well as wrong: a 1 s limit keeps this test quick.
    quick = {**instance, "time_limit": 1}

    async def evaluate(inst: dict, solution: str):
        rollout = new_rollout(inst)
        rollout.state = CodeSolution("solution.py", solution)
        try:
            return await handler.eval(rollout)
        finally:
            await handler.cleanup(rollout)

    reference, empty, wrong = await asyncio.gather(
        evaluate(instance, REFERENCE[task_id]), evaluate(quick, stub), evaluate(quick, WRONG[task_id])
    )
    failed = [t for t in reference.details["tests"] if not t["passed"]]
    assert reference.reward == 1.0 and not failed, failed
    assert empty.reward == 0.0 and empty.details["passed"] == 0
    assert wrong.reward == 0.0 and 0 < wrong.details["total"]
    assert wrong.details["passed"] < wrong.details["total"]
    assert handler.ctx.sandboxes.open_sandboxes() == []

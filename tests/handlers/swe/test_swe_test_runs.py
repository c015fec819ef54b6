"""What a SWE test run may spend, with real bubblewrap sandboxes on the toy repository:

- tests that fork busy children are stopped by the run's CPU budget (the agent's
  failure, or masked with ``stopped_tests: "masked"``), long before the wall timeout;
- an instance's own ``test_timeout`` bounds its run, up to the server's."""

from __future__ import annotations

import shutil

import pytest

from rollserve.errors import AgentError, TimeoutFailure
from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.swe import SWEHandler
from rollserve.handlers.swe import handler as handler_module
from rollserve.sandbox.registry import LazyRuntime
from tests.handlers.swe import toy_repo
from tests.handlers.swe.test_swe_handler import evaluate

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap unavailable")

# mean() forks three busy children and spins itself: a hang that holds every core.
BUSY = """import os


def add(a, b):
    return a + b


def mean(values):
    for _ in range(3):
        if os.fork() == 0:
            while True:
                pass
    while True:
        pass
"""


@pytest.fixture
def toy(tmp_path):
    return toy_repo.build(tmp_path / "mirror")


@pytest.fixture
def handler(tokenizer, tmp_path):
    def make(**options) -> SWEHandler:
        ctx = HandlerContext(tokenizer=tokenizer, scoring=None,
                             sandboxes=LazyRuntime("bubblewrap", tmp_path / "state"),
                             options={"swe": {"mirrors": [str(tmp_path / "mirror")], **options}})
        return SWEHandler(ctx)
    return make


def candidate(toy_dir, path: str, text: str) -> str:
    """The candidate patch that writes ``text`` to ``path`` in the toy repository."""
    repo = toy_dir / "repo"
    target = repo / path
    old = target.read_text()
    target.write_text(text)
    try:
        return toy_repo._git(repo, "diff")
    finally:
        target.write_text(old)


# --- the CPU budget ------------------------------------------------------------------
async def test_tests_that_fork_busy_children_are_stopped_by_the_cpu_budget(handler, new_rollout,
                                                                          toy, tmp_path):
    patch = candidate(tmp_path / "mirror", "calc/ops.py", BUSY)
    with pytest.raises(AgentError, match=r"used up its CPU budget \(2 CPU seconds"):
        await evaluate(handler(test_cpu_seconds=2), new_rollout, toy, patch)
    with pytest.raises(TimeoutFailure, match="CPU budget"):
        await evaluate(handler(test_cpu_seconds=2, stopped_tests="masked"), new_rollout, toy,
                       patch)


async def test_the_default_cpu_budget_is_half_the_runs_timeout(handler, new_rollout, toy,
                                                               monkeypatch):
    budgets = []
    real = handler_module.run_tests

    async def recorded(*args, **kwargs):
        budgets.append(args[6])  # (sandbox, task, script, timeout, env, stopped, cpu_budget)
        return await real(*args, **kwargs)

    monkeypatch.setattr(handler_module, "run_tests", recorded)
    result = await evaluate(handler(), new_rollout, {**toy, "test_timeout": 600}, toy["patch"])
    assert result.reward == 1.0, result.details
    result = await evaluate(handler(test_timeout=90), new_rollout, toy, toy["patch"])
    assert result.reward == 1.0, result.details
    assert budgets == [pytest.approx(300), pytest.approx(45)]


async def test_an_instance_timeout_bounds_its_test_run(handler, new_rollout, toy):
    slow = {**toy, "test_cmd": "sleep 30", "test_timeout": 1}
    with pytest.raises(AgentError, match="did not finish within 1 s"):
        await evaluate(handler(), new_rollout, slow, toy["patch"])


def test_an_instance_timeout_is_checked_against_the_servers(handler, toy):
    swe = handler(test_timeout=100)
    swe.validate({**toy, "test_timeout": 100})
    for bad, words in [(101, "at most this server's test_timeout (100 s)"), (0, "above 0"),
                       ("60", "above 0"), (True, "above 0"), (float("nan"), "above 0")]:
        with pytest.raises(InvalidInstance, match=r"above 0|at most") as error:
            swe.validate({**toy, "test_timeout": bad})
        assert error.value.field == "instance.test_timeout" and words in str(error.value)

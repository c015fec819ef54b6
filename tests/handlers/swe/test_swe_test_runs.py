"""What a SWE test run may spend, and whether it can start at all, with real bubblewrap
sandboxes on the toy repository:

- tests that fork busy children are stopped by the run's CPU budget (the agent's
  failure, or masked with ``stopped_tests: "masked"``), long before the wall timeout;
- an instance's own ``test_timeout`` bounds its run, up to the server's;
- an interpreter that cannot run the tests is infrastructure (masked) at server start,
  INIT and EVAL, named with its option and path; a candidate cannot buy that mask by
  making the tests' command vanish once its code runs."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from rollserve.errors import AgentError, InfraError, TimeoutFailure
from rollserve.handlers.base import InvalidInstance
from rollserve.handlers.swe import handler as handler_module
from rollserve.handlers.swe.grade import END, START
from rollserve.handlers.swe.instances import SWETask
from rollserve.handlers.swe.interpreter import (
    command_of,
    command_words,
    shebang_words,
    static_problem,
)
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
# Imported by every test: deletes the interpreter's shims, then exits 127 ("command not
# found"), as a missing runner would.
VANISH = """import os
os.system("rm -f /tmp/.rollserve-bin/*")
os._exit(127)
"""
NO_PYTEST = "/usr/bin/python3"


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


def python_without_pytest() -> str:
    done = subprocess.run([NO_PYTEST, "-c", "import pytest"], capture_output=True)
    if done.returncode == 0:
        pytest.skip(f"{NO_PYTEST} has pytest")
    return NO_PYTEST


# --- the CPU budget ------------------------------------------------------------------
async def test_tests_that_fork_busy_children_are_stopped_by_the_cpu_budget(handler, new_rollout, toy, tmp_path):
    patch = candidate(tmp_path / "mirror", "calc/ops.py", BUSY)
    with pytest.raises(AgentError, match=r"used up its CPU budget \(2 CPU seconds"):
        await evaluate(handler(test_cpu_seconds=2), new_rollout, toy, patch)
    with pytest.raises(TimeoutFailure, match="CPU budget"):
        await evaluate(handler(test_cpu_seconds=2, stopped_tests="masked"), new_rollout, toy, patch)


async def test_the_default_cpu_budget_is_the_runs_timeout(handler, new_rollout, toy, monkeypatch):
    budgets = []

    def recording(real):
        async def recorded(*args, **kwargs):
            budgets.append(args[6])  # (sandbox, task, script, timeout, env, stopped, cpu_budget)
            return await real(*args, **kwargs)

        return recorded

    monkeypatch.setattr(handler_module, "run_tests", recording(handler_module.run_tests))
    seconds = recording(handler_module.run_tests_recorded)  # the second runner's
    monkeypatch.setattr(handler_module, "run_tests_recorded", seconds)
    result = await evaluate(handler(), new_rollout, {**toy, "test_timeout": 600}, toy["patch"])
    assert result.reward == 1.0, result.details
    first, budgets[:] = list(budgets), []
    result = await evaluate(handler(test_timeout=90), new_rollout, toy, toy["patch"])
    assert result.reward == 1.0, result.details
    # every run of an evaluation (set-up, tests, the second runner) has the one budget
    assert first and all(b == pytest.approx(600) for b in first), first
    assert budgets and all(b == pytest.approx(90) for b in budgets), budgets


async def test_an_instance_timeout_bounds_its_test_run(handler, new_rollout, toy):
    slow = {**toy, "test_cmd": "sleep 30", "test_timeout": 1}
    with pytest.raises(AgentError, match="did not finish within 1 s"):
        await evaluate(handler(), new_rollout, slow, toy["patch"])


def test_an_instance_timeout_is_checked_against_the_servers(handler, toy):
    swe = handler(test_timeout=100)
    swe.validate({**toy, "test_timeout": 100})
    for bad, words in [
        (101, "at most this server's test_timeout (100 s)"),
        (0, "above 0"),
        ("60", "above 0"),
        (True, "above 0"),
        (float("nan"), "above 0"),
    ]:
        with pytest.raises(InvalidInstance, match=r"above 0|at most") as error:
            swe.validate({**toy, "test_timeout": bad})
        assert error.value.field == "instance.test_timeout" and words in str(error.value)


# --- the interpreter -----------------------------------------------------------------
async def test_an_interpreter_without_the_test_runner_is_infra_at_init(handler, new_rollout, toy):
    python = python_without_pytest()
    rollout = new_rollout(toy)
    swe = handler(python=python)
    try:
        with pytest.raises(InfraError) as error:
            await swe.init(rollout)
    finally:
        await swe.cleanup(rollout)
    message = str(error.value)
    assert message.startswith("INIT:") and f"the swe option python: {python}" in message
    assert "cannot import pytest" in message


async def test_an_interpreter_gone_by_eval_is_infra_before_the_patch(handler, new_rollout, toy):
    python = python_without_pytest()
    expected = f"(?s)EVAL, before the candidate patch.*python: {python}.*cannot import pytest"
    with pytest.raises(InfraError, match=expected):
        await evaluate(handler(python=python), new_rollout, toy, toy["patch"])


async def test_a_missing_interpreter_is_named_with_its_path(handler, new_rollout, toy):
    """A name the server-start check cannot look up (the sandbox's PATH has it or not):
    the shim exits 127 in the sandbox, and INIT says which option and path."""
    rollout = new_rollout(toy)
    swe = handler(python="python3.99")
    try:
        with pytest.raises(InfraError, match="(?s)the swe option python: python3.99.*not found.*python does not start"):
            await swe.init(rollout)
    finally:
        await swe.cleanup(rollout)


async def test_a_candidate_cannot_buy_the_mask_by_removing_the_runner(handler, new_rollout, toy, tmp_path):
    """Its code removes the interpreter's shims and exits 127 once the tests import it:
    the probe before the patch passed, so this is the candidate's failure (graded 0)."""
    patch = candidate(tmp_path / "mirror", "calc/__init__.py", VANISH)
    # (the machinery scan would stop its os._exit before the tests: off, to reach the run)
    result = await evaluate(handler(machinery="off"), new_rollout, toy, patch)  # graded
    assert result.reward == 0.0 and not result.details["resolved"]
    assert "Test Exit Code: 127" in result.details["log_tail"]


def test_the_servers_start_refuses_a_python_no_sandbox_sees(handler, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(
        ValueError,
        match=rf"python: {venv}/bin/python: .* lies in /tmp, a "
        "folder host-mode sandboxes do not see",
    ):
        handler(python=str(venv / "bin" / "python"))
    with pytest.raises(ValueError, match="python: /nowhere/python does not exist"):
        handler(python="/nowhere/python")
    handler(python="python3")  # a name on the sandbox's PATH: only a sandbox can tell
    handler(python=NO_PYTEST)  # shown in the sandboxes (whether it has pytest, INIT tells)


def test_static_check_follows_links_and_a_venvs_base(tmp_path):
    hidden, base = tmp_path / "hidden", tmp_path / "open"
    (hidden / "bin").mkdir(parents=True)
    (hidden / "bin" / "python3").write_text("#!/bin/sh\n")
    (base / "venv" / "bin").mkdir(parents=True)
    python = base / "venv" / "bin" / "python"
    python.symlink_to(sys.executable)
    (base / "venv" / "pyvenv.cfg").write_text(f"home = {hidden / 'bin'}\n")
    problem = static_problem(str(python), [str(hidden)], [])
    assert problem is not None and "base interpreter" in problem and str(hidden) in problem
    assert static_problem(str(python), [str(hidden)], [str(hidden)]) is None  # shown again
    link = base / "link"
    link.symlink_to(hidden / "bin" / "python3")
    problem = static_problem(str(link), [str(hidden)], [])
    assert problem is not None and "its target" in problem
    assert static_problem(str(link), [str(tmp_path / "elsewhere")], []) is None
    assert "does not exist" in (static_problem(str(base / "none"), [], []) or "")


def test_the_test_commands_program_is_found_as_the_run_starts_it():
    task = SWETask(
        schema="swe-bench",
        instance_id="a__b-1",
        repo="a/b",
        problem_statement="p",
        test_patch="diff --git a/tests/t.py b/tests/t.py\n",
    )
    assert command_words(command_of(task) or "")[:3] == ["python", "-m", "pytest"]
    task.repo = "sympy/sympy"
    assert command_words(command_of(task) or "")[0] == "bin/test"
    task.eval_script = f"source x\n: '{START}'\nFOO=1 env tox -e py -- a\n: '{END}'\n"
    assert command_words(command_of(task) or "")[0] == "tox"
    assert shebang_words("#!/usr/bin/env python3 -u") == ["python3"]
    assert shebang_words("#!/opt/py/bin/python") == ["/opt/py/bin/python"]
    assert shebang_words("import os") == []

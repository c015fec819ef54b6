"""The code handler: validation, the hidden-test runner and a whole episode, in a
bubblewrap sandbox."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.errors import InfraError
from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.code.handler import CodeHandler, CodeSolution
from rollserve.handlers.code.hidden_tests import split_asserts
from rollserve.handlers.code.prompts import task_text
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.registry import LazyRuntime

STDIO = {
    "problem": "Read two integers and print their sum.",
    "tests": [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "-4 4\n", "output": "0\n"},
        {"input": "10 5\n", "output": "15"},
    ],
}
ASSERTS = {
    "problem": "Write square(n) returning n squared.",
    "entry_point": "square",
    "asserts": "import math\nassert square(2) == 4\nassert square(-3) == 9\n"
    "assert square(0) == 0\nassert math.isqrt(square(12)) == 12\n",
}

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


@pytest.fixture
def handler(tokenizer, tmp_path):
    ctx = HandlerContext(tokenizer=tokenizer, scoring=None, sandboxes=LazyRuntime("bubblewrap", tmp_path / "state"))
    return CodeHandler(ctx)


async def evaluate(handler, new_rollout, instance, solution, solution_file="solution.py"):
    """The handler's EVAL for ``solution``, as if RUN had left it."""
    rollout = new_rollout(instance)
    rollout.state = CodeSolution(solution_file, solution, submitted=True)
    try:
        return await handler.eval(rollout)
    finally:
        await handler.cleanup(rollout)


# --- validation -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "instance, field",
    [
        ({"tests": STDIO["tests"]}, "instance.problem"),
        ({"problem": "p"}, "instance"),
        ({**STDIO, "asserts": "assert 1"}, "instance"),
        ({**STDIO, "tests": []}, "instance.tests"),
        ({**STDIO, "tests": [{"input": "1"}]}, "instance.tests[0].output"),
        ({**STDIO, "tests": [{"input": "1", "output": 2}]}, "instance.tests[0].output"),
        ({**STDIO, "tests": ["1 2"]}, "instance.tests[0]"),
        ({**STDIO, "language": "cpp"}, "instance.language"),
        ({**STDIO, "time_limit": 0}, "instance.time_limit"),
        ({**STDIO, "memory_limit_mb": 8}, "instance.memory_limit_mb"),
        ({**STDIO, "reward": "partial"}, "instance.reward"),
        ({**STDIO, "solution_file": "../x.py"}, "instance.solution_file"),
        ({**STDIO, "solution_file": "class.py"}, "instance.solution_file"),
        ({**STDIO, "solution_file": "json.py"}, "instance.solution_file"),  # the runner imports json
        ({**ASSERTS, "unsafe_checks": "trust"}, "instance.unsafe_checks"),
        ({**ASSERTS, "asserts": "assert square(2 == 4"}, "instance.asserts"),
        ({**ASSERTS, "asserts": "x = 1"}, "instance.asserts"),
        ({**ASSERTS, "entry_point": "cube"}, "instance.entry_point"),
        ({**ASSERTS, "entry_point": "not a name"}, "instance.entry_point"),
        ({**ASSERTS, "starter_code": 3}, "instance.starter_code"),
        ({**ASSERTS, "asserts": "assert " + "-" * 150 + "square(2)"}, "instance.asserts"),
        ({**ASSERTS, "asserts": "assert " + "not " * 5000 + "square(2)"}, "instance.asserts"),
        ({**ASSERTS, "asserts": "assert " + "(" * 100000 + ")" * 100000}, "instance.asserts"),
    ],
)
def test_validation_names_the_field(handler, instance, field):
    with pytest.raises(InvalidInstance) as info:
        handler.validate(instance)
    assert info.value.field == field


def test_handler_options_are_checked(tokenizer):
    with pytest.raises(ValueError, match="unsafe_checks"):
        CodeHandler(HandlerContext(tokenizer=tokenizer, scoring=None, options={"code": {"unsafe_checks": "trust"}}))
    with pytest.raises(ValueError, match="known: unsafe_checks"):
        CodeHandler(HandlerContext(tokenizer=tokenizer, scoring=None, options={"code": {"x": 1}}))


def test_valid_instances_and_the_task_text(handler):
    handler.validate(STDIO)
    handler.validate({**ASSERTS, "reward": "fraction", "time_limit": 2, "memory_limit_mb": 256})
    text = task_text(STDIO["problem"], handler.plan(STDIO), "solution.py", None)
    assert "standard input" in text and "/workspace/solution.py" in text and "4 s of CPU" in text
    text = task_text(ASSERTS["problem"], handler.plan(ASSERTS), "solution.py", "square")
    assert "define `square`" in text and "from solution import *" in text


def test_asserts_split_into_setup_and_one_test_each():
    setup, tests = split_asserts("import math\nassert f(1) == 1\nhelper = 3\nassert (f(2)\n  == 4)\n")
    assert setup == "import math\nhelper = 3"
    assert tests == ["assert f(1) == 1", "assert (f(2)\n  == 4)"]


# --- the hidden tests -------------------------------------------------------------------
@needs_bwrap
async def test_a_correct_stdio_solution_passes_every_case(handler, new_rollout):
    evaluation = await evaluate(handler, new_rollout, STDIO, "a, b = map(int, input().split())\nprint(a + b)\n")
    details = evaluation.details
    assert evaluation.reward == 1.0 and details["passed"] == details["total"] == 3
    assert [t["status"] for t in details["tests"]] == ["passed"] * 3
    assert details["style"] == "stdio" and details["reward_mode"] == "all"
    assert handler.ctx.sandboxes.open_sandboxes() == []


@needs_bwrap
async def test_failures_are_scored_with_a_reason_per_test(handler, new_rollout):
    solution = (
        "import sys, time\n"
        "a, b = map(int, input().split())\n"
        "if a == 1: print(a - b)\n"  # wrong answer
        "elif a == -4: raise ValueError('boom')\n"  # crash
        "else:\n    while True: pass\n"  # spins until the CPU limit
    )
    instance = {**STDIO, "time_limit": 1, "reward": "fraction"}
    evaluation = await evaluate(handler, new_rollout, instance, solution)
    tests = evaluation.details["tests"]
    assert [t["status"] for t in tests] == ["wrong_answer", "error", "timeout"]
    assert "expected '3\\n', got '-1\\n'" in tests[0]["detail"]
    assert "ValueError: boom" in tests[1]["detail"]
    assert evaluation.reward == 0.0 and evaluation.details["passed"] == 0


@needs_bwrap
async def test_asserts_pass_fail_and_fraction(handler, new_rollout):
    good = await evaluate(handler, new_rollout, ASSERTS, "def square(n):\n    return n * n\n")
    assert good.reward == 1.0 and good.details["passed"] == 4
    half = await evaluate(
        handler,
        new_rollout,
        {**ASSERTS, "reward": "fraction"},
        "def square(n):\n    return abs(n) * 2 if n in (2, 0) else n\n",
    )
    assert half.reward == 0.5
    statuses = [t["status"] for t in half.details["tests"]]
    assert statuses == ["passed", "wrong_answer", "passed", "wrong_answer"]
    assert half.details["tests"][1]["source"] == "assert square(-3) == 9"
    assert half.details["tests"][1]["detail"] == "square(-3) = -3"
    assert half.details["tests"][3]["detail"] == "math.isqrt(square(12)) = 3"
    all_mode = await evaluate(
        handler, new_rollout, ASSERTS, "def square(n):\n    return abs(n) * 2 if n in (2, 0) else n\n"
    )
    assert all_mode.reward == 0.0
    # the fraction of tests passed is a component whatever the reward mode
    assert good.components == {"tests_passed": 1.0}
    assert half.components == all_mode.components == {"tests_passed": 0.5}


@needs_bwrap
async def test_a_solution_that_exits_during_import_does_not_pass(handler, new_rollout):
    sneaky = "import sys\nsys.exit(0)\n"
    evaluation = await evaluate(handler, new_rollout, ASSERTS, sneaky)
    assert evaluation.reward == 0.0
    assert {t["status"] for t in evaluation.details["tests"]} == {"error"}


@needs_bwrap
async def test_memory_hog_fails_its_test(handler, new_rollout):
    instance = {**ASSERTS, "memory_limit_mb": 128}
    evaluation = await evaluate(
        handler, new_rollout, instance, "def square(n):\n    x = bytearray(1 << 30)\n    return n * n\n"
    )
    assert evaluation.reward == 0.0
    assert evaluation.details["tests"][0]["status"] == "memory"


@needs_bwrap
async def test_missing_or_empty_solution_scores_zero_without_a_sandbox(handler, new_rollout):
    rollout = new_rollout(STDIO)
    rollout.state = CodeSolution("solution.py", problem="/workspace/solution.py was never written")
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == 0.0 and "never written" in evaluation.details["error"]
    assert evaluation.components == {"tests_passed": 0.0}
    assert handler.ctx.sandboxes.started == 0


@needs_bwrap
async def test_a_test_run_that_cannot_start_is_infra(handler, new_rollout, monkeypatch):
    monkeypatch.setattr(handler, "python", "/nonexistent/python3")
    with pytest.raises(InfraError, match="cannot run /nonexistent/python3"):
        await evaluate(handler, new_rollout, STDIO, "print(3)\n")
    assert handler.ctx.sandboxes.open_sandboxes() == []


@needs_bwrap
async def test_a_reference_run_without_a_report_is_infra(handler, new_rollout):
    # The setup code exits before any report: nothing the policy did, so masked.
    instance = {**ASSERTS, "asserts": "import os\nexpected = 4\nos._exit(3)\nassert square(2) == expected\n"}
    with pytest.raises(InfraError, match="reference run of the tests' setup code"):
        await evaluate(handler, new_rollout, instance, "def square(n):\n    return n * n\n")
    assert handler.ctx.sandboxes.open_sandboxes() == []


async def test_no_sandbox_runtime_is_infra(tokenizer, new_rollout, tmp_path):
    handler = CodeHandler(
        HandlerContext(tokenizer=tokenizer, scoring=None, sandboxes=LazyRuntime("docker", tmp_path / "s"))
    )
    handler.ctx.sandboxes.error = "docker is not on PATH"  # as on a host without it
    rollout = new_rollout(STDIO)
    with pytest.raises(InfraError, match="docker is not on PATH"):
        await handler.init(rollout)


# --- a whole episode ---------------------------------------------------------------------
def call(name, **args):
    return format_tool_call(name, args)


@needs_bwrap
async def test_episode_write_run_submit_then_hidden_tests(handler, new_rollout, scripted):
    replies = [
        "Let me read the task.\n" + call("bash", command="cat README.md"),
        call(
            "str_replace_editor",
            command="create",
            path="/workspace/solution.py",
            file_text="a, b = map(int, input().split())\nprint(a + b)\n",
        ),
        call("bash", command="echo '2 3' | python3 solution.py"),
        "It works.\n" + call("submit"),
    ]
    rollout = new_rollout(STDIO, max_turns=8, max_context_tokens=4096, llm=scripted(replies))
    try:
        await handler.init(rollout)
        assert (rollout.state.sandbox.workspace / "README.md").read_text().startswith("Read two")
        await handler.run(rollout)
        assert rollout.trajectory.ended_by == "finished" and rollout.state.submitted
        assert handler.ctx.sandboxes.open_sandboxes() == []  # RUN's sandbox is closed already
        tools = [m["content"] for m in rollout.trajectory.messages if m["role"] == "tool"]
        assert "Read two integers" in tools[0] and "5\n[exit code: 0]" in tools[2]
        assert rollout.stats["tool_calls"] == 4
        evaluation = await handler.eval(rollout)
    finally:
        await handler.cleanup(rollout)
    assert evaluation.reward == 1.0 and evaluation.details["submitted"]
    assert handler.ctx.sandboxes.started == 2 and handler.ctx.sandboxes.open_sandboxes() == []


@needs_bwrap
async def test_a_reply_without_a_tool_call_ends_the_episode(handler, new_rollout, scripted):
    rollout = new_rollout(
        {**ASSERTS, "starter_code": "def square(n):\n    raise NotImplementedError\n"},
        max_turns=8,
        llm=scripted(["The answer is n*n."]),
    )
    try:
        await handler.init(rollout)
        await handler.run(rollout)
        evaluation = await handler.eval(rollout)
    finally:
        await handler.cleanup(rollout)
    assert rollout.trajectory.ended_by == "no_tool_call" and len(rollout.trajectory.turns) == 1
    assert evaluation.reward == 0.0 and not evaluation.details["submitted"]
    assert {t["status"] for t in evaluation.details["tests"]} == {"error"}  # the starter raises


@needs_bwrap
async def test_submit_refuses_a_missing_file(handler, new_rollout, scripted):
    replies = [
        call("submit", path="/workspace/main.py"),
        call("str_replace_editor", command="create", path="main.py", file_text="print(3)\n"),
        call("submit", path="main.py"),
    ]
    rollout = new_rollout(STDIO, max_turns=5, llm=scripted(replies))
    try:
        await handler.init(rollout)
        await handler.run(rollout)
    finally:
        await handler.cleanup(rollout)
    tools = [m["content"] for m in rollout.trajectory.messages if m["role"] == "tool"]
    assert "does not exist" in tools[0]
    assert rollout.state.path == "main.py" and rollout.state.text == "print(3)\n"

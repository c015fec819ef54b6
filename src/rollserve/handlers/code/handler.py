"""Programming problems: the agent writes and tests a Python solution in a sandbox;
hidden tests decide the reward.

An instance (``data_source: "code"``)::

    {"problem": "Read two integers and print their sum. ...",
     "tests": [{"input": "1 2\\n", "output": "3\\n"}, ...]}          # stdin/stdout cases
    {"problem": "Write solve(n) returning n squared. ...",
     "asserts": "assert solve(2) == 4\\nassert solve(-3) == 9",     # pytest-style asserts
     "entry_point": "solve", "starter_code": "def solve(n):\\n    ...\\n"}

Optional: ``entry_point`` (the function the asserts call; checked against them),
``starter_code`` (the solution file's first content), ``solution_file`` (default
``solution.py``), ``language`` (only ``"python"``), ``time_limit`` (seconds of CPU per
test, default 4), ``memory_limit_mb`` (per test, default 512), ``reward`` (``"all"``,
the default: 1 if every test passes, else 0; or ``"fraction"``: the share passed),
``unsafe_checks`` (an assert that cannot be decided outside the solution's process:
``"fail"`` it or ``"exclude"`` it from the reward; default: the handler option
``unsafe_checks``, itself ``"fail"`` by default).

INIT starts a sandbox with the workspace prepared: ``README.md`` (the problem and
what to write) and the starter code. RUN is a tool episode (bash, the file editor,
``submit``) under a short prompt in the style of current coding agents; a reply that
calls no tool ends it. At its end the solution file is read and the sandbox closed.
EVAL runs the hidden tests in a fresh sandbox holding only the solution file (see
``code.hidden_tests``), with a per-test table in the evaluation details.

All-pass is the default reward because partial credit on hidden tests rewards
solutions that special-case the easy tests (DeepCoder, for one, trains on all-pass);
``"fraction"`` is there for curricula and for diagnostics.
"""

from __future__ import annotations

import ast
import keyword
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollserve.agent import BashTool, EditorTool, ToolEnv, ToolEnvConfig, ToolError, function_schema
from rollserve.agent.base import FinishingTool
from rollserve.handlers.base import (
    AgentHandler,
    Evaluation,
    HandlerContext,
    HandlerDefaults,
    InvalidInstance,
    RolloutView,
)
from rollserve.handlers.code.hidden_tests import HiddenTests, run_tests, sandbox_spec, split_asserts, summary
from rollserve.handlers.code.prompts import SYSTEM_PROMPT, task_text
from rollserve.handlers.episode import run_episode
from rollserve.handlers.sandboxed import close_later, close_sandboxes, open_sandbox
from rollserve.sandbox.base import WORKDIR, Sandbox, SandboxLimits, SandboxSpec, resolve_in_workspace
from rollserve.sandbox.tools import BashConfig
from rollserve.validation import describe

DEFAULT_SOLUTION = "solution.py"
DEFAULT_TIME_LIMIT = 4.0
DEFAULT_MEMORY_MB = 512
MAX_SOLUTION_BYTES = 1 << 20
MAX_TESTS = 500
MAX_ASSERT_DEPTH = 100  # levels of an assert's syntax tree
REWARD_MODES = ("all", "fraction")
UNSAFE_CHECKS = ("fail", "exclude")
_FILE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.py$")


@dataclass
class CodeTask:
    """INIT -> RUN: the task as the agent reads it, and its sandbox."""

    task: str
    solution_file: str
    sandbox: Sandbox


@dataclass
class CodeSolution:
    """RUN -> EVAL: the solution the episode left (``text`` None: there is none, and
    ``problem`` says why: the agent's doing, scored 0)."""

    solution_file: str  # the file the tests import or run it as
    text: str | None = None
    problem: str | None = None
    path: str | None = None  # where it was read, as the agent sees it
    submitted: bool = False  # the agent called submit


class SubmitTool(FinishingTool):
    """``submit``: ends the episode, naming the solution file (default: the task's)."""

    def __init__(self, sandbox: Sandbox, default_path: str) -> None:
        self.sandbox = sandbox
        self.default_path = default_path
        self.finished = False
        self.answer: str | None = None  # the submitted path, as the agent sees it
        self.schema = function_schema(
            "submit",
            "Submit your solution and end the task. Call it once the solution file is written and tested.",
            {"path": {"type": "string", "description": f"the solution file (default {default_path})"}},
            [],
        )

    async def __call__(self, args: dict[str, Any]) -> str:
        path = args.get("path") or self.default_path
        try:
            host = resolve_in_workspace(self.sandbox.workspace, path)
        except PermissionError as exc:
            raise ToolError(str(exc)) from None
        if not host.is_file():
            raise ToolError(
                f"{path} does not exist: write your solution there first, or give the path of the file that holds it"
            )
        self.answer = path
        self.finished = True
        return f"Submitted {path}. The episode is over."


class CodeOptions(BaseModel):
    """The code handler's settings (``rollserve serve --handler-options '{"code": {...}}'``)."""

    model_config = ConfigDict(extra="forbid")

    unsafe_checks: Literal["fail", "exclude"] = Field(
        "fail",
        description="an assert whose verdict would be decided in the solution's own "
        "process (a setup helper, the setup's own asserts, two computed values compared): "
        "fails (status unsafe), or is left out of the reward (status excluded); an "
        "instance's own unsafe_checks field wins",
    )


class CodeHandler(AgentHandler):
    """Python programming problems with hidden stdin/stdout or assert tests."""

    name = "code"
    defaults = HandlerDefaults(
        max_turns=16,
        max_context_tokens=8192,
        init_timeout=60.0,
        run_timeout=900.0,
        eval_timeout=300.0,
        total_timeout=1800.0,
    )
    # The agent's sandbox; the eval sandbox takes the instance's limits instead.
    run_limits = SandboxLimits(memory_mb=2048, pids=128, cpu_seconds=600)
    bash = BashConfig(timeout=60.0, idle_timeout=30.0)
    max_command_seconds = 300.0  # the most a bash call may ask for (its `timeout`)
    python = "python3"  # the interpreter the tests run the solution with

    def __init__(self, ctx: HandlerContext) -> None:
        super().__init__(ctx)
        try:
            self.options = CodeOptions(**ctx.options.get(self.name, {}))
        except ValidationError as error:
            known = ", ".join(CodeOptions.model_fields)
            raise ValueError(f"code handler options: {describe(error)} (known: {known})") from None

    # --- validation --------------------------------------------------------------
    def validate(self, instance: Mapping[str, Any]) -> None:
        if not isinstance(instance, dict):
            raise InvalidInstance("instance", "must be an object")
        problem = instance.get("problem")
        if not isinstance(problem, str) or not problem.strip():
            raise InvalidInstance("instance.problem", "required: the problem statement (a non-empty string)")
        if ("tests" in instance) == ("asserts" in instance):
            raise InvalidInstance(
                "instance",
                "give the hidden tests as either 'tests' (stdin/stdout cases) or 'asserts' (Python asserts), not both",
            )
        language = instance.get("language", "python")
        if language != "python":
            raise InvalidInstance("instance.language", f"only 'python' is supported, got {language!r}")
        _check_solution_file(instance.get("solution_file", DEFAULT_SOLUTION))
        if "starter_code" in instance and not isinstance(instance["starter_code"], str):
            raise InvalidInstance("instance.starter_code", "must be a string")
        entry_point = instance.get("entry_point")
        if entry_point is not None and (not isinstance(entry_point, str) or not entry_point.isidentifier()):
            raise InvalidInstance("instance.entry_point", "must be a Python identifier (a function name)")
        _check_number(instance, "time_limit", 0.1, 60.0)
        _check_number(instance, "memory_limit_mb", 64, 16384, integer=True)
        _check_choices(instance)
        if "tests" in instance:
            _validate_cases(instance["tests"])
        else:
            _validate_asserts(instance["asserts"], entry_point)

    def plan(self, instance: Mapping[str, Any]) -> HiddenTests:
        """The hidden tests of a (valid) instance, ready to run."""
        time_limit = float(instance.get("time_limit", DEFAULT_TIME_LIMIT))
        memory_limit_mb = int(instance.get("memory_limit_mb", DEFAULT_MEMORY_MB))
        if "tests" in instance:
            return HiddenTests("stdio", list(instance["tests"]), "", [], time_limit, memory_limit_mb, self.python)
        setup, asserts = split_asserts(instance["asserts"])
        unsafe = instance.get("unsafe_checks", self.options.unsafe_checks)
        module = instance.get("solution_file", DEFAULT_SOLUTION).removesuffix(".py")
        return HiddenTests(
            "asserts",
            [],
            setup,
            asserts,
            time_limit,
            memory_limit_mb,
            self.python,
            unsafe_checks=unsafe,
            module=module,
            entry_point=instance.get("entry_point"),
        )

    # --- the stages -----------------------------------------------------------------
    async def init(self, rollout: RolloutView) -> None:
        instance = rollout.instance
        self.validate(instance)
        solution_file = instance.get("solution_file", DEFAULT_SOLUTION)
        task = task_text(instance["problem"], self.plan(instance), solution_file, instance.get("entry_point"))
        files = {"README.md": task + "\n"}
        if instance.get("starter_code"):
            files[solution_file] = instance["starter_code"]
        spec = SandboxSpec(
            files=files, limits=self.run_limits, env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        )
        rollout.state = CodeTask(task, solution_file, await open_sandbox(self.ctx, rollout, spec))

    async def run(self, rollout: RolloutView) -> None:
        state = self.state(rollout, CodeTask)
        sandbox, solution_file = state.sandbox, state.solution_file
        bash = BashTool(sandbox, self.bash, max_timeout=self.max_command_seconds)
        editor = EditorTool(sandbox)
        submit = SubmitTool(sandbox, f"{WORKDIR}/{solution_file}")
        close_later(rollout, bash)
        # A reply that calls no tool ends the episode, as in current coding agents.
        config = ToolEnvConfig(call_timeout=self.max_command_seconds + 30.0, on_no_call="end")
        env = ToolEnv([bash, editor, submit], state.task, SYSTEM_PROMPT, tokenizer=self.ctx.tokenizer, config=config)
        await run_episode(self.ctx, rollout, env)
        # The episode is over: take the solution, free the sandbox before EVAL.
        path = submit.answer or solution_file
        text, problem = await _read_solution(sandbox, path)
        rollout.state = CodeSolution(solution_file, text, problem, path, submitted=submit.finished)
        await close_sandboxes(rollout)

    async def eval(self, rollout: RolloutView) -> Evaluation:
        solution = self.state(rollout, CodeSolution)
        instance = rollout.instance
        plan = self.plan(instance)
        mode = instance.get("reward", "all")
        details: dict[str, Any] = {
            "reward_mode": mode,
            "style": plan.style,
            "solution_file": solution.solution_file,
            "submitted": solution.submitted,
            "solution_path": solution.path,
            "time_limit": plan.time_limit,
            "memory_limit_mb": plan.memory_limit_mb,
        }
        if solution.text is None:
            details.update(
                passed=0, total=plan.total, all_passed=False, tests=[], error=solution.problem or "no solution"
            )
            return Evaluation(reward=0.0, details=details, components={"tests_passed": 0.0})
        reward, outcome = await self.run_hidden_tests(rollout, plan, solution.solution_file, solution.text, mode)
        details.update(outcome)
        total = int(outcome.get("total") or 0)
        passed = float(outcome.get("passed") or 0) / total if total > 0 else 0.0
        return Evaluation(reward=reward, details=details, components={"tests_passed": passed})

    async def run_hidden_tests(
        self, rollout: RolloutView, plan: HiddenTests, solution_file: str, solution: str, mode: str
    ) -> tuple[float, dict[str, Any]]:
        """Run ``plan`` against ``solution`` in a fresh sandbox (closed after)."""
        started = time.perf_counter()
        sandbox = await open_sandbox(self.ctx, rollout, sandbox_spec(plan, solution_file, solution))
        try:
            outcomes = await run_tests(sandbox, plan, solution_file)
        finally:
            await close_sandboxes(rollout)
        reward, details = summary(outcomes, mode)
        if plan.style == "asserts":  # the checks that could not be decided outside its process
            details["unsafe_checks"] = [o.test for o in outcomes if o.status in ("unsafe", "excluded")]
            details["unsafe_checks_action"] = plan.unsafe_checks
        details["eval_seconds"] = round(time.perf_counter() - started, 3)
        return reward, details

    async def cleanup(self, rollout: RolloutView) -> None:
        """Close the shell and every sandbox the rollout still has (run's or eval's)."""
        await close_sandboxes(rollout)


async def _read_solution(sandbox: Sandbox, path: str) -> tuple[str | None, str | None]:
    """(the solution's text, None), or (None, why there is none): the agent's doing."""
    try:
        host = resolve_in_workspace(sandbox.workspace, path)
    except PermissionError as exc:
        return None, str(exc)
    if not host.is_file():
        return None, f"{path} was never written"
    size = host.stat().st_size
    if size > MAX_SOLUTION_BYTES:
        return None, f"{path} is {size} bytes (more than {MAX_SOLUTION_BYTES})"
    text = (await sandbox.read_file(path)).decode("utf-8", "replace")
    if not text.strip():
        return None, f"{path} is empty"
    return text, None


# --- validation helpers ----------------------------------------------------------------
def _check_solution_file(solution_file: Any) -> None:
    """A Python file name in the workspace, not ours (``_rollserve*``), a keyword or the
    name of a standard library module (it would stand in for that module)."""
    if (
        not isinstance(solution_file, str)
        or not _FILE_NAME.match(solution_file)
        or keyword.iskeyword(solution_file[:-3])
        or solution_file.startswith("_rollserve")
    ):
        raise InvalidInstance("instance.solution_file", "must be a Python file name in the workspace, e.g. solution.py")
    if solution_file[:-3] in sys.stdlib_module_names:  # it would stand in for that module
        raise InvalidInstance(
            "instance.solution_file",
            f"{solution_file} has the name of a standard library module, which the tests' runner imports",
        )


def _check_choices(instance: Mapping[str, Any]) -> None:
    """``reward`` and ``unsafe_checks``, when given, are among their choices."""
    mode = instance.get("reward", "all")
    if mode not in REWARD_MODES:
        raise InvalidInstance("instance.reward", f"must be 'all' or 'fraction', got {mode!r}")
    unsafe = instance.get("unsafe_checks", "fail")
    if unsafe not in UNSAFE_CHECKS:
        raise InvalidInstance("instance.unsafe_checks", f"must be 'fail' or 'exclude', got {unsafe!r}")


def _check_number(instance: Mapping[str, Any], key: str, low: float, high: float, integer: bool = False) -> None:
    if key not in instance:
        return
    value = instance[key]
    types = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, types) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise InvalidInstance(f"instance.{key}", f"must be {kind} from {low:g} to {high:g}")


def _validate_cases(cases: Any) -> None:
    if not isinstance(cases, list) or not cases:
        raise InvalidInstance("instance.tests", "must be a non-empty list of {input, output} cases")
    if len(cases) > MAX_TESTS:
        raise InvalidInstance("instance.tests", f"at most {MAX_TESTS} cases")
    for index, case in enumerate(cases):
        if not isinstance(case, dict):
            raise InvalidInstance(f"instance.tests[{index}]", "must be an object with input and output")
        for key in ("input", "output"):
            if not isinstance(case.get(key), str):
                raise InvalidInstance(f"instance.tests[{index}].{key}", "required: a string")
        extra = set(case) - {"input", "output"}
        if extra:
            raise InvalidInstance(f"instance.tests[{index}]", f"unknown field(s): {', '.join(sorted(extra))}")


def _validate_asserts(source: Any, entry_point: str | None) -> None:
    if not isinstance(source, str) or not source.strip():
        raise InvalidInstance("instance.asserts", "must be Python source with assert statements")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise InvalidInstance("instance.asserts", f"not valid Python: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, MemoryError, ValueError):  # nested past the parser's limits
        raise InvalidInstance("instance.asserts", "too deeply nested for the Python parser") from None
    asserts = [node for node in tree.body if isinstance(node, ast.Assert)]
    if not asserts:
        raise InvalidInstance("instance.asserts", "has no top-level assert statement")
    if len(asserts) > MAX_TESTS:
        raise InvalidInstance("instance.asserts", f"at most {MAX_TESTS} asserts")
    for node in asserts:  # the server evaluates them (code.asserts), recursively
        if _depth(node) > MAX_ASSERT_DEPTH:
            raise InvalidInstance(
                "instance.asserts",
                f"the assert on line {node.lineno} is nested more than {MAX_ASSERT_DEPTH} levels deep",
            )
    if entry_point is not None:
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        if entry_point not in names:
            raise InvalidInstance("instance.entry_point", f"{entry_point!r} is never used by the asserts")


def _depth(root: ast.AST) -> int:
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest

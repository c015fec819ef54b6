"""Running a code task's hidden tests against a solution, in a fresh sandbox.

Only the solution file goes into the sandbox (no network, its own limits); the tests
stay on the server's side as long as they can:

- stdin/stdout cases: each case is one ``python3 <solution>`` with the case's input
  on stdin; its stdout is compared with the expected output here, token by token
  (whitespace-insensitive, as most judges' default checker).
- asserts: each top-level ``assert`` of the instance's ``asserts`` is one test, run
  in a process of its own by ``code.runner``: it imports the solution module, runs
  the setup code (every statement that is not an assert: imports, helpers), then
  evaluates the assert's *probes*, the operands that need the solution, and reports
  their values in a strict plain encoding. The verdict is reached here, on the
  server, against expected values that never enter the sandbox (``code.asserts``,
  ``code.values``). The test code travels on the runner's stdin, not in a file.
  Probes that need no solution (expected values the setup builds) are computed
  first, in one *reference* run of the runner that never imports the solution (and
  the setup's assignments only they need are left out of the solution's process); a
  check whose verdict would still rest on the solution's process (``Check.unsafe``),
  and every check when the setup code holds asserts of its own, fails with status
  ``unsafe`` or, with ``unsafe_checks: "exclude"``, is left out of the reward
  (``excluded``; the setup's asserts are then removed before it runs).

Limits per test: ``time_limit`` seconds of CPU (RLIMIT_CPU, rounded up to whole
seconds) and a wall-clock limit of twice that plus a second (so load on the host
does not fail a correct solution, and a sleeping one still ends); ``memory_limit_mb``
of address space (or a cgroup, where the runtime has one). A solution that times
out, crashes or runs out of memory just fails that test. A test run that cannot
start at all (the sandbox or the interpreter is broken) is an ``InfraError``: the
interpreter is tried first, and a runtime failure on any test propagates.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import math
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollserve.errors import InfraError
from rollserve.handlers.code.asserts import Check, compile_assert
from rollserve.handlers.code.names import imports_all_of, setup_names
from rollserve.handlers.code.values import MAX_REPORT_BYTES, MalformedReport, Probe, read_report
from rollserve.sandbox.base import ExecResult, Sandbox, SandboxLimits, SandboxSpec

SHOWN_CHARS = 200  # of inputs, outputs and errors in the per-test table

# The assert runner's source, run in the sandbox as ``python3 -c`` (never imported here).
ASSERT_RUNNER = (Path(__file__).parent / "runner.py").read_text(encoding="utf-8")


@dataclass
class Outcome:
    test: int  # 0-based position
    passed: bool
    status: str  # passed | wrong_answer | error | not_plain | timeout | memory | killed |
    #              output_limit | unsafe | excluded (not counted)
    seconds: float
    detail: str = ""  # what went wrong (expected vs got, the error's last line)
    source: str = ""  # the assert, or the case's input (shortened)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HiddenTests:
    """What to run: stdin/stdout cases or asserts, with the limits."""

    style: str  # "stdio" | "asserts"
    cases: list[dict[str, str]]  # stdio: {"input", "output"}
    setup: str  # asserts: code run before each assert
    asserts: list[str]  # asserts: one source per test
    time_limit: float
    memory_limit_mb: int
    python: str = "python3"
    unsafe_checks: str = "fail"  # a check that cannot be decided safely: "fail" | "exclude"
    module: str = "solution"  # the solution's module name
    entry_point: str | None = None  # the function the asserts call

    @property
    def total(self) -> int:
        return len(self.cases) if self.style == "stdio" else len(self.asserts)

    @functools.cached_property
    def checks(self) -> list[Check]:
        """The asserts, compiled to be decided on the server (``code.asserts``)."""
        bound = setup_names(self.setup, self.module)
        solution = frozenset([self.entry_point] if self.entry_point else [])
        return [compile_assert(source, bound, solution) for source in self.asserts]

    @functools.cached_property
    def setup_asserts(self) -> list[int]:
        """The lines of the setup code's own asserts (in a loop, a helper...): decided
        in the solution's process, so no check of the plan is safe while they run."""
        return [node.lineno for node in ast.walk(ast.parse(self.setup)) if isinstance(node, ast.Assert)]

    @functools.cached_property
    def run_setup(self) -> str:
        """The setup code as it runs: without its own asserts when they are excluded."""
        if not self.setup_asserts or self.unsafe_checks != "exclude":
            return self.setup
        tree = _DropAsserts().visit(ast.parse(self.setup))
        return ast.unparse(ast.fix_missing_locations(tree))

    @functools.cached_property
    def reference_setup(self) -> str:
        """The setup code as the reference run runs it: without its top-level
        ``from <solution> import *``, the solution not being there."""
        tree = ast.parse(self.run_setup)
        body = [node for node in tree.body if not imports_all_of(node, self.module)]
        return self.run_setup if len(body) == len(tree.body) else ast.unparse(ast.Module(body, []))

    def setup_for(self, check: Check, clean: dict[int, Probe]) -> str:
        """The setup code the solution's process runs for ``check``: without the
        top-level assignments of names only its reference values need (``expected =
        ...``), so the expected values are never in that process's memory."""
        sent = [check.info[i].names for i in range(len(check.probes)) if i not in clean]
        hide = frozenset().union(*(check.info[i].names for i in clean)) - frozenset().union(*sent)
        if not hide:
            return self.run_setup
        tree = ast.parse(self.run_setup)
        while True:  # names another kept statement reads must stay
            dropped = [node for node in tree.body if _only_binds(node, hide)]
            kept = [node for node in tree.body if node not in dropped]
            read = {n.id for node in kept for n in ast.walk(node) if isinstance(n, ast.Name)}
            if not hide & read:
                break
            hide -= read
        if not dropped:
            return self.run_setup
        return ast.unparse(ast.Module(kept, []))


def _only_binds(node: ast.stmt, names: frozenset[str]) -> bool:
    """An assignment of ``names`` only, with no method call or walrus in its value
    (one that might change another value the tests use)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not all(isinstance(t, ast.Name) and t.id in names for t in targets):
        return False
    return not any(
        isinstance(sub, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await))
        or (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute))
        for sub in ast.walk(node.value)
    )


class _DropAsserts(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.Pass:
        return ast.copy_location(ast.Pass(), node)


def split_asserts(source: str) -> tuple[str, list[str]]:
    """(setup, asserts): the top-level asserts of ``source`` one by one, and all the
    other top-level statements joined as the setup. Raises SyntaxError."""
    tree = ast.parse(source)
    setup: list[str] = []
    asserts: list[str] = []
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ""
        (asserts if isinstance(node, ast.Assert) else setup).append(text)
    return "\n".join(setup), asserts


def sandbox_spec(plan: HiddenTests, solution_file: str, solution: str) -> SandboxSpec:
    """The eval sandbox: the solution file only, no network, the test limits."""
    return SandboxSpec(
        files={solution_file: solution},
        network=False,
        env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
        limits=SandboxLimits(
            memory_mb=plan.memory_limit_mb,
            pids=64,
            file_size_mb=64,
            cpu_seconds=max(1, math.ceil(plan.time_limit)),
            open_files=256,
        ),
    )


async def run_tests(sandbox: Sandbox, plan: HiddenTests, solution_file: str) -> list[Outcome]:
    """Every test of ``plan`` against ``solution_file`` in ``sandbox``, one by one."""
    probe = await sandbox.exec([plan.python, "-c", "print('ok')"], timeout=30)
    if probe.stdout.strip() != "ok":
        raise InfraError(
            f"the test sandbox cannot run {plan.python}: "
            f"exit {probe.exit_code}, {(probe.stderr or probe.stdout).strip()[-300:]}"
        )
    if plan.style == "stdio":
        return [await _run_case(sandbox, plan, solution_file, index) for index in range(plan.total)]
    await asyncio.to_thread(lambda: (plan.checks, plan.reference_setup))  # once, off the event loop
    if plan.setup_asserts and plan.unsafe_checks == "fail":
        lines = ", ".join(map(str, plan.setup_asserts))
        why = f"the setup code's own assert (line {lines}) would be decided in the solution's process"
        return [_unsafe(plan, index, why) for index in range(plan.total)]
    # First, before the solution ever ran here: the values that need no solution.
    references = await _reference_values(sandbox, plan)
    outcomes = []
    for index, check in enumerate(plan.checks):
        clean = check.clean(references)
        unsafe = check.unsafe(frozenset(clean), check.computed(references))
        if unsafe is not None:
            outcomes.append(_unsafe(plan, index, unsafe))
        else:
            outcomes.append(await _run_assert(sandbox, plan, solution_file, index, clean))
    return outcomes


def _unsafe(plan: HiddenTests, index: int, why: str) -> Outcome:
    status = "excluded" if plan.unsafe_checks == "exclude" else "unsafe"
    return Outcome(
        index, False, status, 0.0, _short(f"cannot be decided safely: {why}"), _short(plan.checks[index].source)
    )


async def _reference_values(sandbox: Sandbox, plan: HiddenTests) -> dict[str, Probe]:
    """The probes that may need no solution, computed by the runner without it (one
    that errors there, or a setup that raises, is then the solution's). A run that
    does not end with a report is no doing of the policy (it never saw the solution):
    an InfraError, masked, rather than checks failed as unsafe."""
    sources = list(dict.fromkeys(c.probes[i] for c in plan.checks for i in c.references))
    if not sources:
        return {}
    payload = {"module": None, "setup": plan.reference_setup, "probes": sources, "max_bytes": MAX_REPORT_BYTES}
    result = await sandbox.exec(
        [plan.python, "-c", ASSERT_RUNNER],
        timeout=_wall_limit(plan),
        stdin=(json.dumps(payload) + "\n").encode(),
        max_output=_REPORT_LIMIT,
    )
    failure = _failure(result, plan)
    try:
        if failure is not None:
            raise MalformedReport(f"{failure[0]}: {failure[1]}")
        probes = await asyncio.to_thread(read_report, result.stdout, len(sources))
    except MalformedReport as exc:
        raise InfraError(
            f"the reference run of the tests' setup code (without the solution) gave no report: {_short(str(exc))}"
        ) from None
    return dict(zip(sources, probes))


def _wall_limit(plan: HiddenTests) -> float:
    return 2 * plan.time_limit + 1.0


async def _run_case(sandbox: Sandbox, plan: HiddenTests, solution_file: str, index: int) -> Outcome:
    case = plan.cases[index]
    expected = case["output"]
    limit = 2 * len(expected) + (64 << 10)
    result = await sandbox.exec(
        [plan.python, solution_file], timeout=_wall_limit(plan), stdin=case["input"].encode(), max_output=limit
    )
    outcome = Outcome(index, False, "", round(result.seconds, 4), source=_short(case["input"]))
    failure = _failure(result, plan)
    if failure is not None:
        outcome.status, outcome.detail = failure
    elif result.truncated:
        outcome.status, outcome.detail = "output_limit", f"more than {limit} bytes of output"
    elif result.stdout.split() == expected.split():
        outcome.passed, outcome.status = True, "passed"
    else:
        outcome.status = "wrong_answer"
        outcome.detail = f"expected {_short(expected)!r}, got {_short(result.stdout)!r}"
    return outcome


async def _run_assert(
    sandbox: Sandbox, plan: HiddenTests, solution_file: str, index: int, clean: dict[int, Probe]
) -> Outcome:
    """One assert: the probes without a reference value (``clean``) from the solution."""
    check = plan.checks[index]
    sent = [i for i in range(len(check.probes)) if i not in clean]
    setup = await asyncio.to_thread(plan.setup_for, check, clean)
    payload = {
        "module": solution_file.removesuffix(".py"),
        "setup": setup,
        "probes": [check.probes[i] for i in sent],
        "max_bytes": MAX_REPORT_BYTES,
    }
    result = await sandbox.exec(
        [plan.python, "-c", ASSERT_RUNNER],
        timeout=_wall_limit(plan),
        stdin=(json.dumps(payload) + "\n").encode(),
        max_output=_REPORT_LIMIT,
    )
    outcome = Outcome(index, False, "", round(result.seconds, 4), source=_short(check.source))
    failure = _failure(result, plan)
    if failure is not None:
        outcome.status, outcome.detail = failure
        return outcome
    try:
        # Off the event loop: the report may be megabytes, the check sorts or compares it.
        outcome.status, detail = await asyncio.to_thread(_decide, check, result.stdout, sent, clean)
    except MalformedReport as exc:
        if result.truncated and len(result.stdout) >= _REPORT_LIMIT:
            outcome.status, detail = "output_limit", f"more than {_REPORT_LIMIT} bytes of values"
        else:
            outcome.status = "error"
            detail = f"the test did not report its values (did the solution exit?): {exc}"
    if outcome.status == "memory":
        detail = f"over the memory limit of {plan.memory_limit_mb} MB ({detail})"
    outcome.passed, outcome.detail = outcome.status == "passed", _short(detail)
    return outcome


_REPORT_LIMIT = MAX_REPORT_BYTES + (1 << 16)  # the values, and room for error entries


def _decide(check: Check, report: str, sent: list[int], clean: dict[int, Probe]) -> tuple[str, str]:
    reported = dict(zip(sent, read_report(report, len(sent))))
    return check.verdict([clean[i] if i in clean else reported[i] for i in range(len(check.probes))])


def _failure(result: ExecResult, plan: HiddenTests) -> tuple[str, str] | None:
    """(status, detail) when the test process did not end normally, else None."""
    if result.timed_out:
        return "timeout", f"no result within {_wall_limit(plan):g} s (wall clock)"
    if result.signal == signal.SIGXCPU or (
        result.signal == signal.SIGKILL and result.seconds >= math.ceil(plan.time_limit) * 0.9
    ):
        return "timeout", f"more than {plan.time_limit:g} s of CPU time"
    last = _last_line(result.stderr)
    if "MemoryError" in result.stderr or result.signal == signal.SIGKILL:
        return "memory", f"over the memory limit of {plan.memory_limit_mb} MB ({last or 'killed'})"
    if result.signal == signal.SIGXFSZ:
        return "output_limit", "wrote a file over the size limit"
    if result.signal is not None:
        return "killed", f"killed by signal {signal.Signals(result.signal).name}"
    if result.exit_code != 0:
        return "error", last or f"exit code {result.exit_code}"
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return _short(lines[-1]) if lines else ""


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def summary(outcomes: list[Outcome], mode: str) -> tuple[float, dict[str, Any]]:
    """(reward, details) for the evaluation: all-pass or the fraction passed, of the
    tests not excluded."""
    passed = sum(o.passed for o in outcomes)
    total = sum(o.status != "excluded" for o in outcomes)
    reward = (passed / total if total else 0.0) if mode == "fraction" else float(total > 0 and passed == total)
    return reward, {
        "passed": passed,
        "total": total,
        "all_passed": total > 0 and passed == total,
        "tests": [o.to_dict() for o in outcomes],
    }

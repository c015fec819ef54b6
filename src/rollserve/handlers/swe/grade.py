"""Grading a SWE test log with swebench's own code, and what the log cannot be trusted for.

``grade`` uses ``swebench.harness.grading`` (``get_logs_eval`` with the instance's
log parser, ``get_eval_tests_report``, ``get_resolution_status``): resolved = every
FAIL_TO_PASS test passes and every PASS_TO_PASS test still does. R2E-Gym tasks
compare each test's status with the instance's ``expected_output_json``.

The code under test runs inside the test run and writes to the same log, so:

- a ``PASSED <test> - <error>`` line (a hook turned a failure into a pass and left
  its error on the report) counts as a failure;
- the canary: after the tests, one more pytest run of a test that must fail, in the
  folder of the instance's tests (same conftest files, config, start-up hooks), that
  first runs a test file's module code (so the code under test is imported). If the
  log shows it passed, whatever made it pass rewrote outcomes: unresolved;
- only the log before the tests start (the set-up, which no patch reaches) may show
  an environment fault (swebench's classifier: InfraError, masked); text the tests
  print could otherwise turn a wrong answer into a masked one.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import tempfile
from types import SimpleNamespace
from typing import Any

from rollserve.errors import InfraError
from rollserve.handlers.swe.instances import SWETask

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code"
PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_v2", "parse_log_pytest_options")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PASSED_WITH_ERROR = re.compile(r"^PASSED\s+(\S+)\s+-\s+\S")


def swebench() -> SimpleNamespace:
    """swebench's grading pieces; InfraError telling how to install them."""
    try:
        from swebench.harness import grading
        from swebench.harness.constants import EvalType, ResolvedStatus
        from swebench.harness.infra_failure import TIER_ENVIRONMENT, classify_text
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
        from swebench.types import TestSpec
    except ImportError as exc:
        raise InfraError(f"the swe handler grades with swebench, which is not installed "
                         f"({exc}): pip install 'rollserve[swe]'") from None
    return SimpleNamespace(grading=grading, EvalType=EvalType, ResolvedStatus=ResolvedStatus,
                           TIER_ENVIRONMENT=TIER_ENVIRONMENT, classify_text=classify_text,
                           parsers=PARSER_REGISTRY, repo_parsers=MAP_REPO_TO_PARSER_PY,
                           TestSpec=TestSpec)


def log_parser_name(task: SWETask) -> str:
    """The swebench parser for the task's log: its own, the repository's, or pytest's."""
    if task.log_parser:
        return task.log_parser
    sb = swebench()
    parser = sb.repo_parsers.get(task.repo)
    if parser is not None:
        for name, function in sb.parsers.items():
            if function is parser:
                return name
    return "parse_log_pytest"


def environment_fault(log: str) -> str | None:
    """The environment fault swebench's classifier finds in the set-up part of the
    log (before the tests start), if any."""
    sb = swebench()
    classified = sb.classify_text(log.split(START, 1)[0])
    return classified[0] if classified and classified[1] == sb.TIER_ENVIRONMENT else None


# --- the canary ----------------------------------------------------------------------
def canary_script(task: SWETask, token: str) -> str:
    """Shell lines, run after the tests, that run one failing test named after
    ``token`` beside the instance's test files; '' where the tests are not pytest's."""
    files = [f for f in task.test_files if f.endswith(".py")]
    if task.schema == "r2e-gym" or not files or task.expected is not None:
        return ""
    sb = swebench()
    parser = sb.parsers.get(log_parser_name(task))
    if parser not in [sb.parsers[name] for name in PYTEST_PARSERS]:
        return ""
    folder = os.path.dirname(files[-1])
    path = shlex.quote(f"{folder}/test_{token}.py" if folder else f"test_{token}.py")
    # It first runs the test file's module code (its imports: the code under test),
    # so whatever that code does to the test run is done to the canary too.
    body = f"import runpy\n\n\ndef test_{token}():\n    runpy.run_path({files[-1]!r})\n" \
           "    assert 1 == 2\n"
    return "\n".join([
        f"cat > {path} <<'ROLLSERVE_CANARY'\n{body}ROLLSERVE_CANARY",
        f"python -m pytest --no-header -rA --tb=short -p no:cacheprovider {path}",
        f"rm -f {path}", ""])


def canary_passed(log: str, token: str) -> bool:
    """Whether the log says the canary test passed (it cannot, honestly)."""
    name = re.escape(f"test_{token}")
    pattern = re.compile(rf"^(?:(?:PASSED|XPASS)\s+\S*::{name}\b|\S*::{name}\s+(?:PASSED|XPASS)\b)",
                         re.MULTILINE)
    return bool(pattern.search(_ANSI.sub("", log)))


# --- grading -------------------------------------------------------------------------
def grade(task: SWETask, log: str, canary: str | None = None) -> dict[str, Any]:
    """Resolved or not, and the per-test table, from the test log (CPU: run in a thread).
    ``canary``: the token of the canary test the run ended with, if it had one."""
    if task.expected is not None:
        return _grade_expected(task, log)
    sb = swebench()
    spec = sb.TestSpec(instance_id=task.instance_id, image="", eval_script_list=[], repo=task.repo,
                       version=task.version, FAIL_TO_PASS=task.fail_to_pass,
                       PASS_TO_PASS=task.pass_to_pass, log_parser=log_parser_name(task),
                       eval_type=task.eval_type)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
        handle.write(log)
    try:
        status_map, found = sb.grading.get_logs_eval(spec, handle.name)
    finally:
        os.unlink(handle.name)
    if not found:
        fault = environment_fault(log)
        if fault:
            raise InfraError(f"the test environment of {task.instance_id} failed ({fault}): "
                             f"{log.strip()[-800:]}")
        reason = "the test patch did not apply" if "Patch Apply Failed" in log else \
            "the test log has no parseable results"
        return {"resolved": False, "tests_ran": False, "reason": reason, "tests": [],
                "f2p_passed": 0, "p2p_passed": 0}
    for line in _ANSI.sub("", log).splitlines():
        hit = _PASSED_WITH_ERROR.match(line)
        if hit and hit.group(1) in status_map:  # a pass carrying an error is a failure
            status_map[hit.group(1)] = "FAILED"
    report = sb.grading.get_eval_tests_report(
        status_map, {"FAIL_TO_PASS": task.fail_to_pass, "PASS_TO_PASS": task.pass_to_pass},
        eval_type=sb.EvalType(task.eval_type))
    resolved = sb.grading.get_resolution_status(report) == sb.ResolvedStatus.FULL.value
    tests = []
    for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for outcome in ("success", "failure"):
            for name in report[kind][outcome]:
                tests.append({"test": name, "kind": kind,
                              "status": status_map.get(name, "MISSING"),
                              "ok": outcome == "success"})
    outcome = {"resolved": resolved, "tests_ran": True, "tests": tests,
               "f2p_passed": len(report["FAIL_TO_PASS"]["success"]),
               "p2p_passed": len(report["PASS_TO_PASS"]["success"])}
    if canary is not None:
        outcome["canary"] = "passed" if canary_passed(log, canary) else "failed"
        if outcome["canary"] == "passed":
            outcome.update(resolved=False, reason="a test made to fail was reported passed: "
                           "the test run's outcomes were rewritten")
    return outcome


def _grade_expected(task: SWETask, log: str) -> dict[str, Any]:
    """R2E-Gym: every test's status must be the expected one."""
    body = log.split(START, 1)[-1].split(END, 1)[0]
    parsed = swebench().parsers[task.log_parser or "parse_log_pytest"](body, None)
    by_short = {name.rsplit("/", 1)[-1]: status for name, status in parsed.items()}
    tests = []
    for name, expected in sorted(task.expected.items()):
        got = parsed.get(name, by_short.get(name.rsplit("/", 1)[-1], "MISSING"))
        tests.append({"test": name, "kind": "EXPECTED", "expected": expected, "status": got,
                      "ok": got == expected})
    if not parsed:
        return {"resolved": False, "tests_ran": False, "tests": tests,
                "reason": "the test log has no parseable results"}
    return {"resolved": all(t["ok"] for t in tests), "tests_ran": True, "tests": tests}


async def grade_async(task: SWETask, log: str, canary: str | None = None) -> dict[str, Any]:
    return await asyncio.to_thread(grade, task, log, canary)

"""Grading a SWE test log with swebench's own code, and what the log cannot be trusted for.

``grade`` uses ``swebench.harness.grading`` (``get_logs_eval`` with the instance's
log parser, ``get_eval_tests_report``, ``get_resolution_status``): resolved = every
FAIL_TO_PASS test passes and every PASS_TO_PASS test still does. R2E-Gym tasks
compare each test's status with the instance's ``expected_output_json``.

Where the tests are pytest's, the outcomes come from our plugin's records, not from
the log (see ``results``): lines the code under test prints are not read, and
pytest's own summary lines check the records. Elsewhere (Django's and SymPy's runners,
R2E-Gym) the log is parsed, and the code under test writes to that log too: there a
``PASSED <test> - <error>`` line (a hook turned a failure into a pass and left its
error on the report) counts as a failure. Either way the canaries (see ``canaries``:
tests the server wrote into the graded file that must fail where the tests they copy
pass) check the outcomes; R2E-Gym's have none. The second runner (``recheck``) is the
handler's, after this grade.

Only the log before the tests start (the set-up, which no patch reaches) may show an
environment fault (swebench's classifier: InfraError, masked); text the tests print
could otherwise turn a wrong answer into a masked one.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from types import SimpleNamespace
from typing import Any

from rollserve.errors import InfraError
from rollserve.handlers.swe import canaries, results
from rollserve.handlers.swe.canaries import Placement
from rollserve.handlers.swe.instances import SWETask
from rollserve.handlers.swe.results import Results

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
        raise InfraError(
            f"the swe handler grades with swebench, which is not installed ({exc}): pip install 'rollserve[swe]'"
        ) from None
    return SimpleNamespace(
        grading=grading,
        EvalType=EvalType,
        ResolvedStatus=ResolvedStatus,
        TIER_ENVIRONMENT=TIER_ENVIRONMENT,
        classify_text=classify_text,
        parsers=PARSER_REGISTRY,
        repo_parsers=MAP_REPO_TO_PARSER_PY,
        TestSpec=TestSpec,
    )


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


# --- where the plugin records the outcomes ------------------------------------------
def uses_plugin(task: SWETask) -> bool:
    """Whether the task's tests are pytest's (their outcomes then come from our plugin)."""
    if task.schema == "r2e-gym" or task.expected is not None:
        return False
    sb = swebench()
    return sb.parsers.get(log_parser_name(task)) in [sb.parsers[n] for n in PYTEST_PARSERS]


def canary_file(task: SWETask) -> str | None:
    """The graded test file the canary joins: the first FAIL_TO_PASS test's file, else
    the last test file."""
    for name in task.fail_to_pass:
        path = name.split("::", 1)[0]
        if "::" in name and path.endswith(".py"):
            return path
    files = [f for f in task.test_files if f.endswith(".py")]
    return files[-1] if files else None


# --- grading -------------------------------------------------------------------------
def grade(
    task: SWETask, log: str, recorded: Results | None = None, placement: Placement | None = None
) -> dict[str, Any]:
    """Resolved or not, and the per-test table (CPU: run in a thread), from the plugin's
    ``recorded`` outcomes where the tests are pytest's, else from the test log.
    ``placement``: the canaries the run held (None: canaries off)."""
    if task.expected is not None:
        return _grade_expected(task, log)
    if recorded is not None:
        return _grade_recorded(task, log, recorded, placement)
    sb = swebench()
    spec = swebench_spec(task)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
        handle.write(log)
    try:
        status_map, found = sb.grading.get_logs_eval(spec, handle.name)
    finally:
        os.unlink(handle.name)
    if not found:
        fault = environment_fault(log)
        if fault:
            raise InfraError(f"the test environment of {task.instance_id} failed ({fault}): {log.strip()[-800:]}")
        reason = (
            "the test patch did not apply" if "Patch Apply Failed" in log else "the test log has no parseable results"
        )
        return {"resolved": False, "tests_ran": False, "reason": reason, "tests": [], "f2p_passed": 0, "p2p_passed": 0}
    for line in _ANSI.sub("", log).splitlines():
        hit = _PASSED_WITH_ERROR.match(line)
        if hit and hit.group(1) in status_map:  # a pass carrying an error is a failure
            status_map[hit.group(1)] = "FAILED"
    outcome = _report(task, status_map)
    problem = _check_canaries(outcome, placement, status_map)
    if problem:
        outcome.update(resolved=False, reason=problem)
    return outcome


def _check_canaries(outcome: dict[str, Any], placement: Placement | None, status: dict[str, str]) -> str | None:
    """The canaries' verdict into ``outcome``; the problem if outcomes were rewritten."""
    if placement is None:
        return None
    if not placement.canaries or placement.path is None:
        outcome["canary"] = f"not placed ({placement.note or 'no usable test'})"
        return None
    outcome["canary"], outcome["canaries"], problem = canaries.judge(placement.canaries, placement.path, status)
    return problem


def swebench_spec(task: SWETask) -> Any:
    return swebench().TestSpec(
        instance_id=task.instance_id,
        image="",
        eval_script_list=[],
        repo=task.repo,
        version=task.version,
        FAIL_TO_PASS=task.fail_to_pass,
        PASS_TO_PASS=task.pass_to_pass,
        log_parser=log_parser_name(task),
        eval_type=task.eval_type,
    )


def _report(task: SWETask, status_map: dict[str, str]) -> dict[str, Any]:
    """swebench's verdict and the per-test table for a test -> status map."""
    sb = swebench()
    report = sb.grading.get_eval_tests_report(
        status_map,
        {"FAIL_TO_PASS": task.fail_to_pass, "PASS_TO_PASS": task.pass_to_pass},
        eval_type=sb.EvalType(task.eval_type),
    )
    resolved = sb.grading.get_resolution_status(report) == sb.ResolvedStatus.FULL.value
    tests = []
    for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for outcome in ("success", "failure"):
            for name in report[kind][outcome]:
                tests.append(
                    {"test": name, "kind": kind, "status": status_map.get(name, "MISSING"), "ok": outcome == "success"}
                )
    graded: dict[str, Any] = {
        "resolved": resolved,
        "tests_ran": True,
        "tests": tests,
        "f2p_passed": len(report["FAIL_TO_PASS"]["success"]),
        "p2p_passed": len(report["PASS_TO_PASS"]["success"]),
    }
    return graded


def _grade_recorded(task: SWETask, log: str, recorded: Results, placement: Placement | None) -> dict[str, Any]:
    """The grade from the plugin's records, checked against the log and the canary."""
    status, conflicts = results.statuses(recorded)
    if "Patch Apply Failed" in log:
        return {
            "resolved": False,
            "tests_ran": False,
            "reason": "the test patch did not apply",
            "tests": [],
            "f2p_passed": 0,
            "p2p_passed": 0,
        }
    if not status:
        fault = environment_fault(log)
        if fault:
            raise InfraError(f"the test environment of {task.instance_id} failed ({fault}): {log.strip()[-800:]}")
        return {
            "resolved": False,
            "tests_ran": False,
            "tests": [],
            "f2p_passed": 0,
            "p2p_passed": 0,
            "reason": "the test run recorded no test outcomes",
        }
    parser = swebench().parsers[log_parser_name(task)]
    leave_out = (
        canaries.canary_keys(placement.canaries, placement.path, status)
        if placement is not None and placement.path
        else set()
    )
    status_map = parser(results.synthetic_log(status, leave_out), swebench_spec(task))
    outcome = _report(task, status_map)
    outcome["results_from"] = "plugin"
    problems = []
    if conflicts:
        outcome["conflicting_reports"] = conflicts[:20]
    if recorded.unreadable:
        problems.append(f"{recorded.unreadable} line(s) of the recorded results are not ours")
    disagreement = results.disagreement(recorded, log)
    if disagreement:
        problems.append(disagreement)
    problem = _check_canaries(outcome, placement, status)
    if problem:
        problems.append(problem)
    if problems:
        outcome.update(resolved=False, reason="; ".join(problems))
    return outcome


def _grade_expected(task: SWETask, log: str) -> dict[str, Any]:
    """R2E-Gym: every test's status must be the expected one."""
    body = log.split(START, 1)[-1].split(END, 1)[0]
    parsed = swebench().parsers[task.log_parser or "parse_log_pytest"](body, None)
    by_short = {name.rsplit("/", 1)[-1]: status for name, status in parsed.items()}
    tests = []
    for name, expected in sorted((task.expected or {}).items()):
        got = parsed.get(name, by_short.get(name.rsplit("/", 1)[-1], "MISSING"))
        tests.append({"test": name, "kind": "EXPECTED", "expected": expected, "status": got, "ok": got == expected})
    if not parsed:
        return {
            "resolved": False,
            "tests_ran": False,
            "tests": tests,
            "reason": "the test log has no parseable results",
        }
    return {"resolved": all(t["ok"] for t in tests), "tests_ran": True, "tests": tests}


async def grade_async(
    task: SWETask, log: str, recorded: Results | None = None, placement: Placement | None = None
) -> dict[str, Any]:
    return await asyncio.to_thread(grade, task, log, recorded, placement)

"""EVAL for SWE tasks: the test script, its run, and grading with swebench's own code.

The script has SWE-bench's shape: reset the files the test patch touches to
``base_commit``, apply the test patch, run the tests between swebench's start/end
markers and record the test command's exit code. Instances from swebench>=5
datasets bring their own ``eval_script`` (used as it is: the workspace is also
mounted at ``/testbed``). The log is graded by ``swebench.harness.grading``
(``get_logs_eval`` with the instance's log parser, ``get_eval_tests_report``,
``get_resolution_status``): resolved = every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still does. R2E-Gym tasks compare each test's status with the
instance's ``expected_output_json``.

A test run that times out raises ``TimeoutFailure``; one that cannot start, or whose
log swebench classifies as an environment fault, raises ``InfraError``: masked,
never scored as a wrong answer.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import tempfile
from types import SimpleNamespace
from typing import Any

from rollserve.errors import InfraError, TimeoutFailure
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

TEST_PATCH_FILE = ".git/rollserve-test.diff"  # in the sandbox's repository
START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code"
MAX_LOG_BYTES = 8 << 20

# Test commands of well-known repositories whose suites are not plain pytest
# (for datasets without their own eval_script); everything else runs pytest -rA.
KNOWN_COMMANDS = {
    "django/django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {modules}",
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose {files}",
}
PYTEST = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider {files}"


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


def suite_command(task: SWETask) -> str:
    """The command that runs the task's tests (the instance's ``test_cmd`` if given)."""
    files = [f for f in task.test_files if f.endswith(".py")]
    if task.test_cmd:
        return task.test_cmd.replace("{files}", " ".join(map(shlex.quote, files)))
    template = KNOWN_COMMANDS.get(task.repo, PYTEST)
    modules = [f.removeprefix("tests/").removesuffix(".py").replace("/", ".") for f in files]
    return template.format(files=" ".join(map(shlex.quote, files)), modules=" ".join(modules))


def eval_script(task: SWETask, activate: str | None) -> str:
    """The bash script that applies the test patch and runs the tests (SWE-bench's shape)."""
    if task.eval_script:
        return task.eval_script
    lines = ["#!/bin/bash", "set -uxo pipefail"]  # (it starts in the workspace: the repository)
    if activate:
        lines.append(activate)
    if task.schema == "r2e-gym":
        lines += ["rm -rf r2e_tests", "cp -r /r2e_tests r2e_tests",
                  *_between_markers(task.test_cmd or "bash run_tests.sh")]
        return "\n".join(lines) + "\n"
    base = shlex.quote(task.base_commit or "HEAD")
    for path in task.test_files:  # only files that exist at base can be checked out
        quoted = shlex.quote(path)
        lines.append(f"if git cat-file -e {base}:{quoted} 2>/dev/null; then "
                     f"git checkout {base} -- {quoted}; else rm -f {quoted}; fi")
    lines += [f"git apply --verbose {TEST_PATCH_FILE} || {{ echo '>>>>> Patch Apply Failed'; exit 1; }}",
              *_between_markers(suite_command(task))]
    return "\n".join(lines) + "\n"


def _between_markers(command: str) -> list[str]:
    """``command`` between swebench's start/end markers, its exit code recorded after."""
    return [f"echo '{START}'", command, "SWEBENCH_TEST_EXIT_CODE=$?", f"echo '{END}'",
            f'echo "{EXIT}: $SWEBENCH_TEST_EXIT_CODE"']


async def run_tests(sandbox: Sandbox, task: SWETask, script: str, timeout: float,
                    env: dict[str, str] | None = None) -> str:
    """Run ``script`` in ``sandbox`` (the candidate patch already applied); the log."""
    if task.test_patch:
        await sandbox.write_file(TEST_PATCH_FILE, task.test_patch)
    result = await sandbox.exec(["bash", "-c", script], timeout=timeout, env=env,
                                max_output=MAX_LOG_BYTES)
    if result.timed_out:
        raise TimeoutFailure(f"the tests of {task.instance_id} did not finish within {timeout:g} s")
    log = result.stdout + ("\n" + result.stderr if result.stderr else "")
    if result.exit_code is None:
        raise InfraError(f"the test run of {task.instance_id} was killed (signal "
                         f"{result.signal}): {log.strip()[-800:]}")
    return log


def grade(task: SWETask, log: str) -> dict[str, Any]:
    """Resolved or not, and the per-test table, from the test log (CPU: run in a thread)."""
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
        classified = sb.classify_text(log)
        if classified and classified[1] == sb.TIER_ENVIRONMENT:
            raise InfraError(f"the test environment of {task.instance_id} failed "
                             f"({classified[0]}): {log.strip()[-800:]}")
        reason = "the test patch did not apply" if "Patch Apply Failed" in log else \
            "the test log has no parseable results"
        return {"resolved": False, "tests_ran": False, "reason": reason, "tests": [],
                "f2p_passed": 0, "p2p_passed": 0}
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
    return {"resolved": resolved, "tests_ran": True, "tests": tests,
            "f2p_passed": len(report["FAIL_TO_PASS"]["success"]),
            "p2p_passed": len(report["PASS_TO_PASS"]["success"])}


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


async def grade_async(task: SWETask, log: str) -> dict[str, Any]:
    return await asyncio.to_thread(grade, task, log)

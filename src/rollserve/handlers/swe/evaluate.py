"""EVAL for SWE tasks: the test script and its run (grading: ``grade``).

The script has SWE-bench's shape: reset the files the test patch touches to
``base_commit``, apply the test patch, run the tests between swebench's start/end
markers and record the test command's exit code. Instances from swebench>=5
datasets bring their own ``eval_script`` (used as it is: the workspace is also
mounted at ``/testbed``). Our own script runs in two halves (``script_halves``): the
set-up (the test patch applied, then its diff file deleted), then the tests, the
canaries written into the graded file in between (see ``canaries``). The script's
stdout and stderr are one stream, in order, as in SWE-bench's harness.

A test run that outlives its limit, uses up its CPU budget (all its processes
together: ``SWEOptions.test_cpu_seconds``), or that a signal kills, is the patch's
doing (an endless loop, a deadlock, busy forks, a test that kills its runner):
``AgentError``, reward 0,
not masked (``SWEOptions.stopped_tests: "masked"`` makes it a masked timeout or
infra failure instead). Evidence of an infrastructure fault makes it ``InfraError``
(masked) either way: the script stopped before the tests started (the set-up, which
no patch reaches, hung or died), or that set-up's output shows an environment fault
(swebench's classifier).
"""

from __future__ import annotations

import re
import shlex
from typing import Literal

from rollserve.errors import AgentError, InfraError, TimeoutFailure
from rollserve.handlers.swe.grade import END, EXIT, START, environment_fault
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import ExecResult, Sandbox

TEST_PATCH_FILE = ".git/rollserve-test.diff"  # in the sandbox's repository
MAX_LOG_BYTES = 8 << 20
RECORDS_FD = 3  # run_tests_recorded: the descriptor a plugin writes its records to
RECORDS_MAX_BYTES = 32 << 20  # records past this were not written by a plugin alone
# A record line on it: the first run's ``<json>``, the second's ``<hmac> <json>``.
_RECORD = re.compile(r"^(?:[0-9a-f]{64} )?\{")

# Test commands of well-known repositories whose suites are not plain pytest
# (for datasets without their own eval_script); everything else runs pytest -rA.
APPLY_FAILED = ">>>>> Patch Apply Failed"
KNOWN_COMMANDS = {
    "django/django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {modules}",
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose {files}",
}
PYTEST = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider {files}"


def suite_command(task: SWETask) -> str:
    """The command that runs the task's tests (the instance's ``test_cmd`` if given)."""
    files = [f for f in task.test_files if f.endswith(".py")]
    if task.test_cmd:
        return task.test_cmd.replace("{files}", " ".join(map(shlex.quote, files)))
    template = KNOWN_COMMANDS.get(task.repo, PYTEST)
    modules = [f.removeprefix("tests/").removesuffix(".py").replace("/", ".") for f in files]
    return template.format(files=" ".join(map(shlex.quote, files)), modules=" ".join(modules))


def runner_paths(task: SWETask) -> frozenset[str]:
    """Repository files the task's test command runs (``bin/test``, ``./tests/runtests.py``,
    ``run_tests.sh``): test infrastructure the candidate may not change."""
    command = task.test_cmd or ("bash run_tests.sh" if task.schema == "r2e-gym" else KNOWN_COMMANDS.get(task.repo, ""))
    try:
        words = shlex.split(command.replace("{files}", "").replace("{modules}", ""))
    except ValueError:
        words = command.split()
    paths = set()
    for word in words:
        path = word.removeprefix("./")
        if "=" in word or word.startswith(("-", "/", "$")) or ".." in path:
            continue
        if "/" in path or path.endswith((".py", ".sh")):
            paths.add(path)
    return frozenset(paths)


def eval_script(task: SWETask, activate: str | None) -> str:
    """The bash script that applies the test patch and runs the tests (SWE-bench's shape)."""
    if task.eval_script:
        return task.eval_script
    halves = script_halves(task, activate)
    if halves is None:  # R2E-Gym
        lines = _head(activate) + [
            "rm -rf r2e_tests",
            "cp -r /r2e_tests r2e_tests",
            *_between_markers(task.test_cmd or "bash run_tests.sh"),
        ]
        return "\n".join(lines) + "\n"
    return halves[0] + "\n".join(_between_markers(suite_command(task))) + "\n"


def script_halves(task: SWETask, activate: str | None) -> tuple[str, str] | None:
    """Our script in two: the set-up (reset the test files, apply the test patch, then
    delete its diff file: nothing on disk then tells the test patch's tests from tests
    added after it, the canaries) and the test run; None where the instance brings its
    own script (or is R2E-Gym's)."""
    if task.eval_script or task.schema == "r2e-gym":
        return None
    lines = _head(activate)
    base = shlex.quote(task.base_commit or "HEAD")
    for path in task.test_files:  # only files that exist at base can be checked out
        quoted = shlex.quote(path)
        lines.append(
            f"if git cat-file -e {base}:{quoted} 2>/dev/null; then "
            f"git checkout {base} -- {quoted}; else rm -f {quoted}; fi"
        )
    lines += [
        f"git apply --verbose {TEST_PATCH_FILE} || {{ echo '{APPLY_FAILED}'; exit 1; }}",
        f"rm -f {TEST_PATCH_FILE}",
    ]
    tests = _head(activate) + _between_markers(suite_command(task))
    return "\n".join(lines) + "\n", "\n".join(tests) + "\n"


def _head(activate: str | None) -> list[str]:
    lines = ["#!/bin/bash", "set -uxo pipefail"]  # (it starts in the workspace: the repository)
    return lines + [activate] if activate else lines


def _between_markers(command: str) -> list[str]:
    """``command`` between swebench's start/end markers, its exit code recorded after."""
    return [
        f"echo '{START}'",
        command,
        "SWEBENCH_TEST_EXIT_CODE=$?",
        f"echo '{END}'",
        f'echo "{EXIT}: $SWEBENCH_TEST_EXIT_CODE"',
    ]


async def run_tests(
    sandbox: Sandbox,
    task: SWETask,
    script: str,
    timeout: float,
    env: dict[str, str] | None = None,
    stopped: Literal["agent", "masked"] = "agent",
    cpu_budget: float | None = None,
    *,
    write_test_patch: bool = True,
) -> str:
    """Run ``script`` in ``sandbox`` (the candidate patch already applied); the log.
    ``cpu_budget``: CPU seconds for all the run's processes together (sandbox/cpucap.py);
    ``write_test_patch``: put the test patch where the script applies it from."""
    log, _ = await _run(sandbox, task, script, timeout, env, stopped, cpu_budget, write_test_patch, records=False)
    return log


async def run_tests_recorded(
    sandbox: Sandbox,
    task: SWETask,
    script: str,
    timeout: float,
    env: dict[str, str] | None = None,
    stopped: Literal["agent", "masked"] = "agent",
    cpu_budget: float | None = None,
    *,
    write_test_patch: bool = True,
) -> tuple[str, str]:
    """As ``run_tests``, with descriptor ``RECORDS_FD`` of the script open on the
    server's own pipe (the command's stderr; the script's stdout and stderr are the
    log): the log, and what was written to that descriptor (a plugin's records). No
    path names it, nothing in the sandbox reads back what reached it."""
    return await _run(sandbox, task, script, timeout, env, stopped, cpu_budget, write_test_patch, records=True)


async def _run(
    sandbox: Sandbox,
    task: SWETask,
    script: str,
    timeout: float,
    env: dict[str, str] | None,
    stopped: Literal["agent", "masked"],
    cpu_budget: float | None,
    write_test_patch: bool,
    *,
    records: bool,
) -> tuple[str, str]:
    if task.test_patch and write_test_patch:
        await sandbox.write_file(TEST_PATCH_FILE, task.test_patch)
    head = f"exec {RECORDS_FD}>&2 2>&1\n" if records else "exec 2>&1\n"
    result = await sandbox.exec(
        ["bash", "-c", head + script],
        timeout=timeout,
        env=env,
        max_output=RECORDS_MAX_BYTES if records else MAX_LOG_BYTES,
        cpu_budget=cpu_budget,
    )
    lines = result.stderr.splitlines(keepends=True)
    written = "".join(line for line in lines if records and _RECORD.match(line))
    # (the runtime's own words, a cap's notice, join the log)
    other = "".join(line for line in lines if not (records and _RECORD.match(line)))
    log = result.stdout + ("\n" + other if other else "")
    if result.timed_out or result.exit_code is None:
        _stopped(task, result, log, timeout, stopped, cpu_budget)
    return log, written


def _stopped(
    task: SWETask,
    result: ExecResult,
    log: str,
    timeout: float,
    blame: Literal["agent", "masked"],
    cpu_budget: float | None = None,
) -> None:
    """Raise the typed failure of a test run that timed out, used up its CPU budget
    (a hang that holds cores, like a timeout) or was killed."""
    if result.cap == "cpu":
        how = f"used up its CPU budget ({cpu_budget:g} CPU seconds for all its processes together, test_cpu_seconds)"
    elif result.timed_out:
        how = f"did not finish within {timeout:g} s"
    else:
        how = f"was killed by signal {result.signal}"
    tail = log.strip()[-800:]
    if START not in log:
        raise InfraError(
            f"the test script of {task.instance_id} {how} before its tests "
            f"started (the set-up, which no patch reaches): {tail}"
        )
    fault = environment_fault(log)
    if fault:
        raise InfraError(f"the test environment of {task.instance_id} failed ({fault}) and the test run {how}: {tail}")
    if blame == "masked":
        if result.timed_out or result.cap == "cpu":
            raise TimeoutFailure(f"the tests of {task.instance_id} {how}")
        raise InfraError(f"the test run of {task.instance_id} {how}: {tail}")
    raise AgentError(
        f"the tests of {task.instance_id} {how} with the candidate patch "
        f"applied (the patch's doing: a hang, an endless loop, a killed "
        f"runner): {tail}"
    )

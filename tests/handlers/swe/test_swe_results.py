"""The grader's pytest plugin (``results_plugin``) in a real pytest run, and how its
records are read (``results``): statuses as ``-rA`` shows them, conflicts and the
summary check; the second runner's plugin (``recheck_plugin``) beside a forger, and its
records, read from descriptor 3 of the test script as the handler reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollserve.handlers.swe import recheck, results
from rollserve.handlers.swe.evaluate import RECORDS_FD
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import WORKDIR

TESTS = """import pytest


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup")


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")


def test_ok():
    assert 1 + 1 == 2


def test_bad():
    assert 1 + 1 == 3


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    pass


@pytest.mark.skip(reason="no")
def test_skipped():
    pass


@pytest.mark.xfail
def test_xfail():
    assert False


@pytest.mark.xfail
def test_xpass():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1
"""


def run(
    tmp_path: Path,
    tests: str = "tests",
    plan: recheck.Plan | None = None,
) -> tuple[str, results.Results, str]:
    """The log, the first plugin's records and what reached descriptor 3 (the second
    runner's records), as the handler's test script runs them."""
    (tmp_path / tests).mkdir(exist_ok=True)
    (tmp_path / tests / "test_things.py").write_text(TESTS)
    folder = tmp_path / ".git" / "grader"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in results.files().items():
        (folder / name).write_text(text)
    script = results.shell_setup(str(folder))
    if plan is not None:  # the second runner's plugin too
        (tmp_path / plan.folder).mkdir(parents=True)
        for name, text in plan.files().items():
            (tmp_path / plan.folder / name).write_text(text)
        script += plan.shell_setup().replace(f"{WORKDIR}/", f"{tmp_path}/")
    script += f"{sys.executable} -m pytest --no-header -rA --tb=no -p no:cacheprovider {tests}\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        ["bash", "-c", f"exec {RECORDS_FD}>&2 2>&1\n" + script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    # (both plugins write to it here: the first's lines are bare JSON)
    lines = done.stderr.splitlines(keepends=True)
    first = "".join(line for line in lines if line.startswith("{"))
    second = "".join(line for line in lines if not line.startswith("{"))
    return done.stdout, results.parse(first), second


def test_statuses_and_counts_from_a_real_run_agree_with_pytests_own(tmp_path):
    log, recorded, _ = run(tmp_path)
    status, conflicts = results.statuses(recorded)
    name = "tests/test_things.py::"
    assert status == {
        name + "test_ok": "PASSED",
        name + "test_bad": "FAILED",
        name + "test_setup_error": "ERROR",
        name + "test_teardown_error": "ERROR",
        name + "test_skipped": "SKIPPED",
        name + "test_xfail": "XFAIL",
        name + "test_xpass": "XPASS",
        name + "test_param[1]": "PASSED",
        name + "test_param[2]": "FAILED",
    }, log
    assert conflicts == [] and recorded.sessions == 1 and recorded.unreadable == 0
    assert results.disagreement(recorded, log) is None, (log, results.counts(recorded))
    assert sorted(p.name for p in (tmp_path / ".git" / "grader").iterdir()) == [
        "rollserve_results.py"
    ]  # no configuration to read the canaries from, no records file


FORGE = """import sys
if "_pytest.reports" in sys.modules:
    from _pytest.reports import TestReport
    made = TestReport.from_item_and_call

    def forged(item, call):
        report = made(item, call)
        if report.outcome == "failed":
            report.outcome, report.longrepr = "passed", None
        return report

    TestReport.from_item_and_call = staticmethod(forged)
"""


# Makes pytest's run of each item swallow what the test function raised.
SWALLOW_RUN = """from _pytest.python import Function
run = Function.runtest


def swallowed(self):
    try:
        run(self)
    except Exception:
        pass


Function.runtest = swallowed
"""


@pytest.mark.parametrize("forger", [FORGE, SWALLOW_RUN], ids=["reports", "item-run"])
def test_the_second_runner_sees_the_calls_a_forger_reported_passed(tmp_path, forger):
    """The issue's forger rewrites every report, the other makes pytest's run of each
    item swallow the test's error: the first plugin records passes, the second runner's
    plugin (pytest's calls observed) the failures; its key file is gone."""
    (tmp_path / "forger.py").write_text(forger)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text("import forger  # noqa\n")
    plan = recheck.Plan.draw()
    log, recorded, records = run(tmp_path, plan=plan)
    status, _ = results.statuses(recorded)
    name = "tests/test_things.py::"
    assert status[name + "test_bad"] == "PASSED" and status[name + "test_param[2]"] == "PASSED", log
    seen = recheck.parse(records, plan.key)
    assert seen.loaded and seen.foreign == 0 and seen.out_of_order == 0, records
    assert seen.raised[name + "test_bad"] and seen.raised[name + "test_param[2]"]
    assert not seen.raised[name + "test_ok"] and not seen.raised[name + "test_param[1]"]
    assert seen.raised.get(name + "test_setup_error", True)  # its setup failed: never a pass
    # Nothing is left beside the plugin (the key file is gone, no records file), and
    # no line holds the key.
    assert os.listdir(tmp_path / plan.folder) == [f"{plan.module}.py"]
    assert plan.key not in records and plan.key not in log
    # Lines without the key (written by the code under test) are not counted.
    forged = json.dumps({"event": "call", "nodeid": name + "test_bad", "raised": False, "key": plan.key, "n": 99})
    again = recheck.parse(records + forged + "\n" + "0" * 64 + " " + forged, plan.key)
    assert again.raised[name + "test_bad"] and again.foreign == 2 and again.out_of_order == 0


def test_second_runner_records_taken_or_replayed_make_it_disagree():
    """A keyed line taken out of the pipe (one test's raising call) leaves a gap in the
    numbering; one written twice, or out of order, breaks it too."""
    key = "k" * 32
    task = SWETask(
        schema="swe-bench",
        instance_id="a__b-1",
        repo="a/b",
        problem_statement="p",
        fail_to_pass=["t.py::ok"],
        log_parser="parse_log_pytest",
    )

    def line(n: int, **record: object) -> str:
        body = json.dumps({"n": n, **record}, sort_keys=True)
        return recheck.sign(body, key) + " " + body + "\n"

    loaded = line(0, event="loaded")
    bad = line(1, event="call", nodeid="t.py::bad", raised=True)
    ok = line(2, event="call", nodeid="t.py::ok", raised=False)
    again = line(1, event="call", nodeid="t.py::bad", raised=False)
    assert recheck.parse(loaded + bad + ok, key).out_of_order == 0
    for text in (loaded + ok, loaded + bad + ok + again, loaded + ok + bad):
        seen = recheck.parse(text, key)
        assert seen.out_of_order >= 1, text
        checked = recheck.verdict(task, seen)
        assert checked["agreed"] is False and "out of order" in checked["reason"]
    assert recheck.parse(loaded + bad + ok, "x" * 32).foreign == 3  # another key: none ours


def test_a_phase_reported_twice_with_different_outcomes_is_a_failure():
    lines = [
        {"event": "report", "nodeid": "t.py::a", "when": when, "outcome": outcome, "longrepr": False, "wasxfail": False}
        for when, outcome in [("setup", "passed"), ("call", "failed"), ("call", "passed"), ("teardown", "passed")]
    ]
    lines += [
        {
            "event": "report",
            "nodeid": "t.py::b",
            "when": "call",
            "outcome": "passed",
            "longrepr": True,
            "wasxfail": False,
        },
        {"event": "finish", "exitstatus": 1},
    ]
    recorded = results.parse("\n".join(map(json.dumps, lines)) + "\nPASSED t.py::a\n")
    status, conflicts = results.statuses(recorded)
    assert status == {"t.py::a": "FAILED", "t.py::b": "FAILED"} and conflicts == ["t.py::a"]
    assert recorded.unreadable == 1  # a line that is not ours


def test_a_summary_line_that_disagrees_with_the_records_is_reported(tmp_path):
    log, recorded, _ = run(tmp_path)
    forged = log + "\n============================== 9 passed in 0.01s ===============================\n"
    assert "disagree" in results.disagreement(recorded, forged)
    assert "summary line" in results.disagreement(recorded, "PASSED tests/test_things.py::test_bad\n")
    assert results.disagreement(results.Results(), log) == "the test run recorded no finished pytest session"


def test_a_pytest_started_by_the_tests_does_not_load_the_plugin(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_child.py").write_text(
        "import os, subprocess, sys\n\n\ndef test_child():\n"
        "    assert 'rollserve_results' not in os.environ.get('PYTEST_ADDOPTS', '')\n"
    )
    folder = tmp_path / ".git" / "grader"
    folder.mkdir(parents=True)
    for name, text in results.files().items():
        (folder / name).write_text(text)
    script = results.shell_setup(str(folder)) + f"{sys.executable} -m pytest -rA -p no:cacheprovider tests\n"
    done = subprocess.run(
        ["bash", "-c", f"exec {RECORDS_FD}>&2 2>&1\n" + script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "PASSED tests/test_child.py::test_child" in done.stdout, done.stdout + done.stderr
    assert results.statuses(results.parse(done.stderr))[0] == {"tests/test_child.py::test_child": "PASSED"}

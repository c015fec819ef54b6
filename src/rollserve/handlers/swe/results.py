"""Test outcomes from our pytest plugin (``results_plugin``), not from the log.

The code under test prints to the same stream as pytest, so any ``PASSED
tests/...::test_x`` line in the log may be its own. Where the tests are pytest's, the
EVAL script loads our plugin (``-p rollserve_results``, from a folder in ``.git`` that
no patch reaches) and the grade comes from the JSON lines it writes to descriptor 3 of
the test script, the server's own pipe (``evaluate.run_tests_recorded``), not a file:

- each test's status is made from its setup/call/teardown reports as pytest's ``-rA``
  summary would show it, then read by the instance's swebench parser (so test names
  are the ones FAIL_TO_PASS and PASS_TO_PASS use);
- a phase reported twice with different outcomes, or a pass carrying an error
  (``longrepr``), is a failure;
- the counts of the reports must equal the counts of pytest's own summary lines in
  the log (the last one per session), else unresolved (something rewrote one of them);
- the canaries (tests that must fail, written into the graded test file by the server:
  see ``canaries``) must be reported failed, else unresolved.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

MODULE = "rollserve_results"
COUNTED = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
_SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+ ?s", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def folder(token: str) -> str:
    """Where the plugin is, relative to the workspace (inside ``.git``: a patch cannot
    add or change files there; code the tests run still can, at run time)."""
    return f".git/rollserve-grader-{token}"


def files() -> dict[str, str]:
    """The plugin's files (name -> text): the module alone (it has no configuration:
    nothing the code under test can read tells which tests are the canaries)."""
    source = resources.files("rollserve.handlers.swe").joinpath("results_plugin.py").read_text()
    return {f"{MODULE}.py": source}


def shell_setup(workspace_folder: str, module: str = MODULE) -> str:
    """Shell lines that make every pytest the script starts load the plugin ``module``
    (ours, or the second runner's) from ``workspace_folder``."""
    return (
        f'export PYTHONPATH="{workspace_folder}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'export PYTEST_ADDOPTS="-p {module}${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}"\n'
    )


@dataclass
class Results:
    """What the plugin wrote."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    collected: list[dict[str, Any]] = field(default_factory=list)  # errors and skips
    sessions: int = 0
    unreadable: int = 0


def parse(text: str) -> Results:
    results = Results()
    for line in text.splitlines():
        try:
            record = json.loads(line)
            event = record["event"]
        except (ValueError, KeyError, TypeError):
            results.unreadable += 1
            continue
        if event == "report":
            results.reports.append(record)
        elif event == "collect":
            results.collected.append(record)
        elif event == "finish":
            results.sessions += 1
        else:
            results.unreadable += 1
    return results


def statuses(results: Results) -> tuple[dict[str, str], list[str]]:
    """Each test's status as ``-rA`` would show it (ERROR after a failed setup or
    teardown), and the tests whose phases were reported with different outcomes."""
    phases: dict[str, dict[str, set[tuple[str, bool, bool]]]] = {}
    for report in results.reports:
        if report.get("outcome") == "rerun":
            continue
        key = (str(report.get("outcome")), bool(report.get("longrepr")), bool(report.get("wasxfail")))
        phases.setdefault(str(report.get("nodeid")), {}).setdefault(str(report.get("when")), set()).add(key)
    status: dict[str, str] = {}
    conflicts = []
    for nodeid, by_phase in phases.items():
        if any(len({k[0] for k in keys}) > 1 for keys in by_phase.values()):
            conflicts.append(nodeid)
            status[nodeid] = "FAILED"
            continue
        status[nodeid] = _status(by_phase)
    for record in results.collected:
        if record.get("outcome") == "failed":
            status[str(record.get("nodeid"))] = "ERROR"
    return status, conflicts


def _status(by_phase: dict[str, set[tuple[str, bool, bool]]]) -> str:
    def one(when: str) -> tuple[str, bool, bool] | None:
        keys = by_phase.get(when)
        return next(iter(keys)) if keys else None

    setup, call, teardown = one("setup"), one("call"), one("teardown")
    if setup and setup[0] == "failed":
        return "ERROR"
    if setup and setup[0] == "skipped":
        return "XFAIL" if setup[2] else "SKIPPED"
    if call is None:
        return "ERROR"  # never ran its body
    if call[0] == "failed" or (call[0] == "passed" and call[1]):  # a pass with an error
        return "FAILED"
    if teardown and teardown[0] == "failed":
        return "ERROR"
    if call[0] == "skipped":
        return "XFAIL" if call[2] else "SKIPPED"
    return "XPASS" if call[2] else "PASSED"


def counts(results: Results) -> Counter[str]:
    """The counts pytest's summary line shows, made from the reports."""
    counted: Counter[str] = Counter()
    for report in results.reports:
        outcome, when, xfail = report.get("outcome"), report.get("when"), report.get("wasxfail")
        if outcome == "skipped":
            counted["xfailed" if xfail else "skipped"] += 1
        elif outcome == "failed":
            counted["failed" if when == "call" else "error"] += 1
        elif outcome == "passed" and when == "call":
            counted["xpassed" if xfail else "passed"] += 1
    for record in results.collected:
        counted["error" if record.get("outcome") == "failed" else "skipped"] += 1
    return counted


def log_summaries(log: str) -> list[Counter[str]]:
    """The counts of each pytest summary line in the log (``3 passed, 1 failed in 0.2s``)."""
    found = []
    for match in _SUMMARY.finditer(_ANSI.sub("", log)):
        counted: Counter[str] = Counter()
        for part in match.group(1).split(", "):
            number, _, what = part.partition(" ")
            what = {"errors": "error"}.get(what, what)
            if what in COUNTED:
                counted[what] += int(number)
        found.append(counted)
    return found


def disagreement(results: Results, log: str) -> str | None:
    """Why the log's summary lines and the plugin's reports disagree, if they do."""
    summaries = log_summaries(log)
    if results.sessions == 0:
        return "the test run recorded no finished pytest session"
    if len(summaries) < results.sessions:
        return f"{results.sessions} pytest session(s) finished but the log has {len(summaries)} summary line(s)"
    logged: Counter[str] = Counter()
    for summary in summaries[-results.sessions :]:
        logged.update(summary)
    reported = counts(results)
    if any(logged[k] != reported[k] for k in COUNTED):
        shown = ", ".join(f"{k} {logged[k]}/{reported[k]}" for k in COUNTED if logged[k] or reported[k])
        return f"pytest's summary and the recorded outcomes disagree (log/recorded: {shown})"
    return None


def synthetic_log(status: dict[str, str], leave_out: Collection[str] = ()) -> str:
    """The ``-rA`` short summary the statuses make, for the instance's swebench parser."""
    return "".join(f"{s} {nodeid}\n" for nodeid, s in status.items() if nodeid not in leave_out)

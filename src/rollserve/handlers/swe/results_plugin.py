# ruff: noqa: UP006
"""The pytest plugin that records each test's outcome for the grader (copied into the
EVAL sandbox, loaded with ``-p rollserve_results``).

It imports nothing of rollserve and keeps to hooks and attributes that pytest has had
since 3.x, as SWE-bench's images run old pytest versions. It writes one JSON line per
event to ``results.jsonl`` beside it, through a descriptor opened when pytest loads it
(before any conftest or code under test): every test phase's report (setup, call,
teardown), collection errors and skips, and each session's end.
Lines the code under test prints reach the log, never this file. (Code under test runs
in this process with the same uid: code written to find this file, or to patch pytest
itself, can still rewrite what is recorded. The README says what is and is not caught.)

It has no configuration and knows nothing of the canaries: the server writes them
into the graded test file as source (see ``canaries``) and alone knows which they are.
"""

import json
import os
from typing import Any, Dict  # noqa: UP035 (old Pythons in SWE-bench images)

_HERE = os.path.dirname(os.path.abspath(__file__))
_OUT = os.open(os.path.join(_HERE, "results.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

# Only this process: a pytest the tests start themselves does not load the plugin.
_ADDOPTS = os.environ.get("PYTEST_ADDOPTS", "").replace("-p rollserve_results", "").strip()
if _ADDOPTS:
    os.environ["PYTEST_ADDOPTS"] = _ADDOPTS
else:
    os.environ.pop("PYTEST_ADDOPTS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HERE)


_STATE = {"worker": False}


def _write(record: Dict[str, Any]) -> None:
    os.write(_OUT, (json.dumps(record) + "\n").encode())


def pytest_configure(config: Any) -> None:
    # An xdist worker's reports reach the controller, which records them.
    _STATE["worker"] = hasattr(config, "workerinput") or hasattr(config, "slaveinput")


def pytest_runtest_logreport(report: Any) -> None:
    if _STATE["worker"]:
        return
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when,
            "outcome": report.outcome, "longrepr": report.longrepr is not None,
            "wasxfail": hasattr(report, "wasxfail")})


def pytest_collectreport(report: Any) -> None:
    if report.outcome != "passed" and not _STATE["worker"]:
        _write({"event": "collect", "nodeid": report.nodeid, "outcome": report.outcome})


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    if not _STATE["worker"]:
        _write({"event": "finish", "exitstatus": int(exitstatus)})

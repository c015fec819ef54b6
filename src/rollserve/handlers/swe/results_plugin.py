# ruff: noqa: UP006
"""The pytest plugin that records each test's outcome for the grader (copied into the
EVAL sandbox, loaded with ``-p rollserve_results``).

It imports nothing of rollserve and keeps to hooks and attributes that pytest has had
since 3.x, as SWE-bench's images run old pytest versions. It writes one JSON line per
event to descriptor 3, which the test script opened on the server's own pipe (the
command's stderr) before anything ran, through a copy it makes when pytest loads it
(before any conftest or code under test): every test phase's report (setup, call,
teardown), collection errors and skips, and each session's end. Lines the code under
test prints reach the log, never this pipe, and there is no file to rewrite. (Code under
test runs in this process with the same uid: lines it writes to the descriptor itself are
read too (a report contradicting the plugin's is a failure), and code that patches pytest
or this plugin can still change what is recorded. docs/security.md says what is and is
not caught.)

It has no configuration and knows nothing of the canaries: the server writes them
into the graded test file as source (see ``canaries``) and alone knows which they are.
"""

import json
import os
from typing import Any, Dict  # noqa: UP035 (old Pythons in SWE-bench images)

RECORDS_FD = 3  # opened by the test script on the server's pipe (see ``evaluate``)
_HERE = os.path.dirname(os.path.abspath(__file__))
try:
    _OUT = os.dup(RECORDS_FD)  # (not inherited by what the tests start)
except OSError:  # none here (an xdist worker: the controller records): nothing to write to
    _OUT = -1
_WRITE, _DUMPS = os.write, json.dumps  # (as they are now, before any code under test)

# Only this process: a pytest the tests start themselves does not load the plugin.
_ADDOPTS = os.environ.get("PYTEST_ADDOPTS", "").replace("-p rollserve_results", "").strip()
if _ADDOPTS:
    os.environ["PYTEST_ADDOPTS"] = _ADDOPTS
else:
    os.environ.pop("PYTEST_ADDOPTS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HERE
)


_STATE = {"worker": False}


def _write(record: Dict[str, Any]) -> None:
    if _OUT >= 0:
        _WRITE(_OUT, (_DUMPS(record) + "\n").encode())


def pytest_configure(config: Any) -> None:
    # An xdist worker's reports reach the controller, which records them.
    _STATE["worker"] = hasattr(config, "workerinput") or hasattr(config, "slaveinput")


def pytest_runtest_logreport(report: Any) -> None:
    if _STATE["worker"]:
        return
    _write(
        {
            "event": "report",
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "longrepr": report.longrepr is not None,
            "wasxfail": hasattr(report, "wasxfail"),
        }
    )


def pytest_collectreport(report: Any) -> None:
    if report.outcome != "passed" and not _STATE["worker"]:
        _write({"event": "collect", "nodeid": report.nodeid, "outcome": report.outcome})


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    if not _STATE["worker"]:
        _write({"event": "finish", "exitstatus": int(exitstatus)})

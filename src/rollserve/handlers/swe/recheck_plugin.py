# ruff: noqa: UP006
"""The second runner's pytest plugin (layer B: see ``recheck``), copied into a fresh
EVAL sandbox under a name and in a folder drawn per rollout, loaded with ``-p``.

It reads nothing of pytest's reports, report hooks or terminal: it wraps each test's
call at two levels, pytest's run of the item (``pytest_runtest_call``) and, for plain
test functions, pytest's call of the function itself (``pytest_pyfunc_call``), each
the outermost wrapper, and notes whether either raised (for unittest cases, whether
unittest handed pytest an error; a plain function whose call was never seen did not
pass), so a forger that rewrites reports, outcomes or summaries, or makes the item's
run swallow what the function raised, does not reach what it notes. Each line it writes
carries a key that it read from a file beside it and deleted as it loaded (before any
conftest or code under test ran): lines without it are not ours. Like the first
run's plugin it keeps to hooks pytest has had since 3.x and imports nothing of
rollserve. (An xdist worker finds no key: it writes nothing, so a test command that
distributes its tests cannot be checked this way, and disagrees.)
"""

import json
import os
from typing import Any, Dict  # noqa: UP035 (old Pythons in SWE-bench images)

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_KEY_FILE = os.path.join(_HERE, "key")
try:
    with open(_KEY_FILE) as _handle:
        _KEY = _handle.read().strip()
    os.unlink(_KEY_FILE)
except OSError:  # taken already (a second pytest, an xdist worker): not ours to note
    _KEY = ""
_OUT = os.open(os.path.join(_HERE, "seen.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

# Only this process: a pytest the tests start themselves does not load the plugin.
_ADDOPTS = os.environ.get("PYTEST_ADDOPTS", "").replace("-p " + __name__, "").strip()
if _ADDOPTS:
    os.environ["PYTEST_ADDOPTS"] = _ADDOPTS
else:
    os.environ.pop("PYTEST_ADDOPTS", None)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HERE)


def _write(record: Dict[str, Any]) -> None:
    if not _KEY:
        return
    record["key"] = _KEY
    os.write(_OUT, (json.dumps(record) + "\n").encode())


_write({"event": "loaded"})


_FUNCTIONS: Dict[str, bool] = {}  # node id -> whether pytest's call of the function raised


def _plain_function(item: Any) -> bool:
    try:
        from _pytest.unittest import TestCaseFunction
    except ImportError:  # (every pytest since 3.x has it)
        return False
    return isinstance(item, pytest.Function) and not isinstance(item, TestCaseFunction)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> Any:
    outcome = yield
    nodeid = pyfuncitem.nodeid
    _FUNCTIONS[nodeid] = _FUNCTIONS.get(nodeid, False) or outcome.excinfo is not None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: Any) -> Any:
    _FUNCTIONS.pop(item.nodeid, None)
    outcome = yield
    raised = outcome.excinfo is not None or bool(getattr(item, "_excinfo", None))
    if _plain_function(item):
        raised = raised or _FUNCTIONS.pop(item.nodeid, True)
    _write({"event": "call", "nodeid": item.nodeid, "raised": raised})

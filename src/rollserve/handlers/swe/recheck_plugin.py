# ruff: noqa: UP006
"""The second runner's pytest plugin (layer B: see ``recheck``), copied into a fresh
EVAL sandbox under a name and in a folder drawn per rollout, loaded with ``-p``.

It reads nothing of pytest's reports, report hooks or terminal: it wraps each test's
call at two levels, pytest's run of the item (``pytest_runtest_call``) and, for plain
test functions, pytest's call of the function itself (``pytest_pyfunc_call``), each
the outermost wrapper, and notes whether either raised (for unittest cases, whether
unittest handed pytest an error; a plain function whose call was never seen did not
pass), so a forger that rewrites reports, outcomes or summaries, or makes the item's
run swallow what the function raised, does not reach what it notes.

Its lines go to descriptor 3, which the test script opened on the server's own pipe (the
command's stderr) before anything ran: no file holds them, no path in the workspace
names them, and what is written cannot be rewritten (a line taken out of the pipe, by
opening it again through ``/proc``, never reaches the server). Each line is ``<mac>
<json>``: an HMAC-SHA256 of the JSON under a key the plugin read from a file beside it
and deleted as it loaded (before any conftest or code under test ran), the JSON
numbered from 0, so the server counts only lines made with the key and sees one taken,
replayed or reordered. The key
itself is never written, nor kept in a module global: only the HMAC state, in the
closure of the writer. (Code in this process can still find this module and call or
patch it: docs/security.md says what stands against that.) Like the first run's plugin it
keeps to hooks pytest has had since 3.x and imports nothing of rollserve. (An xdist
worker finds no key: it writes nothing, so a test command that distributes its tests
cannot be checked this way, and disagrees.)
"""

import hashlib
import hmac
import json
import os
from typing import Any, Callable, Dict  # noqa: UP035 (old Pythons in SWE-bench images)

import pytest

RECORDS_FD = 3  # opened by the test script on the server's pipe (see ``evaluate``)

# Only this process: a pytest the tests start themselves does not load the plugin.
_ADDOPTS = os.environ.get("PYTEST_ADDOPTS", "").replace("-p " + __name__, "").strip()
if _ADDOPTS:
    os.environ["PYTEST_ADDOPTS"] = _ADDOPTS
else:
    os.environ.pop("PYTEST_ADDOPTS", None)
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HERE
)


def _writer() -> "Callable[[Dict[str, Any]], None] | None":
    """The function that writes one record, or None where there is no key (taken already:
    a second pytest, an xdist worker) or no records descriptor: not ours to note."""
    key_file = os.path.join(_HERE, "key")
    try:
        with open(key_file, "rb") as handle:
            key = handle.read().strip()
        os.unlink(key_file)
        out = os.dup(RECORDS_FD)  # (not inherited by what the tests start)
    except OSError:
        return None
    mac = hmac.new(key, digestmod=hashlib.sha256)
    del key
    count = [0]
    write, dumps = os.write, json.dumps  # (as they are now, before any code under test)

    def _write(record: Dict[str, Any]) -> None:
        record["n"] = count[0]
        count[0] += 1
        line = dumps(record, sort_keys=True)
        signed = mac.copy()
        signed.update(line.encode())
        write(out, (signed.hexdigest() + " " + line + "\n").encode())

    return _write


_WRITE = _writer()


def _note(record: Dict[str, Any]) -> None:
    if _WRITE is not None:
        _WRITE(record)


_note({"event": "loaded"})


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
    _note({"event": "call", "nodeid": item.nodeid, "raised": raised})

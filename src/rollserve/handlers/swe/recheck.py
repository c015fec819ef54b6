"""The second runner (layer B of forgery detection): the test files of a candidate
that the first run graded resolved are run again, in a fresh sandbox (the same
environment, the candidate patch applied again, the test files reset and the test
patch applied, with no canaries: pristine), by pytest with a different plugin
(``recheck_plugin``): it notes whether each test's call raised, at
``pytest_runtest_call`` and ``pytest_pyfunc_call``, not what pytest reports. Its
module name, folder and key are drawn per rollout; the key is read and deleted as the
plugin loads. The plugin's lines reach the server through the test command's stderr
(descriptor 3 of the test script: ``evaluate.run_tests_recorded``), never a file:
each carries an HMAC of itself under the key and a number, so lines made without the
key are not counted, and a line taken out of the pipe or replayed makes the run
disagree. Agreement is required: every FAIL_TO_PASS test (and PASS_TO_PASS, unless
the instance grades failures only; the same files run, so they cost nothing more)
must be seen called without raising here, else unresolved (the reason and the second
run's statuses in the evaluation). A test that is flaky can make an honest candidate
disagree: it had to pass twice.

What it catches: a forger that rewrites pytest's reports, report hooks, terminal
output or our first plugin's records (the issue's ``TestReport.from_item_and_call``
wrapper, however it tells the canaries apart), one that makes pytest's run of an item
swallow the test's error, one that forges only in the first run (it can tell the
runs apart: the second is honest, so they disagree), and one that rewrites what the
plugin wrote (there is no file to rewrite, and no line holds the key). What it
cannot: a forger that makes the test functions themselves return (wrapped as pytest
gets them, ``Function._getobj`` patched, or at import; assertions rewritten away):
the canaries (layer A: a canary's function is wrapped too) and the scan of the
candidate's changes (layer C) are for those, as for code that finds this plugin in
memory and calls or patches its writer (it holds the key's HMAC state). It runs only
where the first run's outcomes come from our pytest plugin: Django's ``runtests.py``
and SymPy's ``bin/test`` get the canaries and the scan, not this; nor do instances
that bring their own ``eval_script``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from rollserve.handlers.swe import results
from rollserve.handlers.swe.grade import log_parser_name, swebench, swebench_spec
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import WORKDIR

RUNNER = "pytest, each test's call observed (not its report)"


@dataclass(frozen=True)
class Plan:
    """Where the second run's plugin is and the key its lines carry (drawn per rollout)."""

    folder: str  # relative to the workspace
    module: str
    key: str

    @classmethod
    def draw(cls) -> Plan:
        return cls(f".git/{secrets.token_hex(5)}", f"_{secrets.token_hex(4)}", secrets.token_hex(16))

    def files(self) -> dict[str, str]:
        source = resources.files("rollserve.handlers.swe").joinpath("recheck_plugin.py").read_text()
        return {f"{self.module}.py": source, "key": self.key}

    def shell_setup(self) -> str:
        return results.shell_setup(f"{WORKDIR}/{self.folder}", self.module)


@dataclass
class Seen:
    """What the second run's plugin wrote: each test node id called, and whether any
    of its calls raised."""

    loaded: bool = False
    raised: dict[str, bool] = field(default_factory=dict)
    foreign: int = 0  # lines not made with the key (anything else on the pipe)
    out_of_order: int = 0  # keyed lines whose number is not the next one (taken or replayed)


def sign(line: str, key: str) -> str:
    """The HMAC the plugin puts before a record's JSON ``line``."""
    return hmac.new(key.encode(), line.encode(), hashlib.sha256).hexdigest()


def parse(text: str, key: str) -> Seen:
    """The plugin's records among ``text`` (the test command's stderr): ``<mac> <json>``
    lines whose HMAC under ``key`` holds, numbered from 0."""
    seen = Seen()
    expected = 0
    for line in text.splitlines():
        mac, _, body = line.partition(" ")
        try:
            ok = secrets.compare_digest(mac.encode(), sign(body, key).encode())
            record = json.loads(body) if ok else None
        except (ValueError, UnicodeError):
            ok = False
        if not ok or not isinstance(record, dict):
            seen.foreign += 1
            continue
        if record.get("n") != expected:
            seen.out_of_order += 1
        expected += 1
        if record.get("event") == "loaded":
            seen.loaded = True
        elif record.get("event") == "call":
            nodeid = str(record.get("nodeid"))
            seen.raised[nodeid] = seen.raised.get(nodeid, False) or bool(record.get("raised", True))
    return seen


def graded_tests(task: SWETask) -> list[str]:
    """The tests the second run must see pass: FAIL_TO_PASS, and PASS_TO_PASS unless
    the instance grades failures only."""
    return task.fail_to_pass + (task.pass_to_pass if task.eval_type != "fail_only" else [])


def verdict(task: SWETask, seen: Seen) -> dict[str, Any]:
    """Whether every graded test passed in the second run (the names as the
    instance's swebench parser makes them from the node ids)."""
    status = {nodeid: "FAILED" if raised else "PASSED" for nodeid, raised in seen.raised.items()}
    named = swebench().parsers[log_parser_name(task)](results.synthetic_log(status), swebench_spec(task))
    tests = {name: named.get(name, "MISSING") for name in graded_tests(task)}
    failing = [name for name, s in tests.items() if s != "PASSED"]
    checked: dict[str, Any] = {"runner": RUNNER, "tests": tests, "agreed": not failing}
    if seen.foreign:
        checked["foreign_lines"] = seen.foreign
    if not seen.loaded:
        checked["agreed"] = False
        checked["reason"] = "the second runner's plugin never loaded"
    elif seen.out_of_order:
        checked.update(
            agreed=False,
            out_of_order_lines=seen.out_of_order,
            reason=f"{seen.out_of_order} of the second runner's records came out "
            "of order (lines taken from its pipe or replayed)",
        )
    elif failing:
        checked["reason"] = (
            f"the second runner saw {len(failing)} graded test(s) the first "
            f"run passed not pass ({', '.join(failing[:5])}): the first run's "
            "outcomes were rewritten"
        )
    return checked

# ruff: noqa: UP006
"""The pytest plugin that records each test's outcome for the grader (copied into the
EVAL sandbox next to its ``config.json``, loaded with ``-p rollserve_results``).

It imports nothing of rollserve and keeps to hooks and attributes that pytest has had
since 3.x, as SWE-bench's images run old pytest versions. It writes one JSON line per
event to ``results.jsonl`` beside it, through a descriptor opened when pytest loads it
(before any conftest or code under test): every test phase's report (setup, call,
teardown), collection errors and skips, the canary's node id and each session's end.
Lines the code under test prints reach the log, never this file. (Code under test runs
in this process with the same uid: code written to find this file, or to patch pytest
itself, can still rewrite what is recorded. The README says what is and is not caught.)

The canary: a test that must fail, compiled into the graded test module's own
namespace (with that file's name) under a name made like the module's own tests, put
among them in the same session. If it is reported passed, outcomes were rewritten.
"""

import json
import os
import random
from typing import Any, Dict, List  # noqa: UP035 (old Pythons in SWE-bench images)

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "config.json")) as _handle:
    _CONFIG: Dict[str, Any] = json.load(_handle)
_OUT = os.open(os.path.join(_HERE, "results.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
_SUFFIXES = ("edge_cases", "regression", "roundtrip", "consistency", "basic", "simple",
             "repeated", "mixed", "empty", "large", "default", "again")

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


def _module_path(module: Any) -> str:
    return str(getattr(module, "path", None) or module.fspath)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: List[Any]) -> None:
    target = _CONFIG.get("canary_file")
    if not target or not _CONFIG.get("token"):
        return
    try:
        _add_canary(items, target, random.Random(_CONFIG["token"]))
    except Exception as error:  # noqa: BLE001 (an old pytest, or something in the way: say so)
        _write({"event": "canary_error", "error": f"{type(error).__name__}: {error}"[:300]})


def _add_canary(items: List[Any], target: str, rng: random.Random) -> None:
    # Only a leading "./" goes: a test file may live under a dot folder (".ci/test_x.py").
    suffix = "/" + (target[2:] if target.startswith("./") else target)
    positions = [i for i, item in enumerate(items)
                 if _module_path(item.getparent(pytest.Module) or item).endswith(suffix)]
    if not positions:
        _write({"event": "canary_error", "error": f"no collected test in {target}"})
        return
    module = items[positions[0]].getparent(pytest.Module)
    names = {item.name for i in positions for item in [items[i]]}
    bases = sorted({getattr(items[i], "originalname", None) or items[i].name.split("[")[0]
                    for i in positions})
    name = ""
    for _ in range(100):
        name = f"{rng.choice(bases)}_{rng.choice(_SUFFIXES)}"
        name = name if name.startswith("test") else "test_" + name
        if name not in names and not hasattr(module.obj, name):
            break
    else:
        name = f"test_{rng.choice(_SUFFIXES)}_{rng.randrange(10**6)}"
    left, right = rng.sample(range(10, 99), 2)
    source = f"def {name}():\n    assert {left} == {right}\n"
    exec(compile(source, _module_path(module), "exec"), module.obj.__dict__)  # noqa: S102
    if hasattr(pytest.Function, "from_parent"):
        canary = pytest.Function.from_parent(module, name=name)
    else:
        canary = pytest.Function(name, parent=module)
    items.insert(rng.choice(positions) + 1, canary)
    _write({"event": "canary", "nodeid": canary.nodeid})


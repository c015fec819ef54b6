"""The machinery scan through the HTTP API, with real bubblewrap sandboxes: a forger
that gets past the canaries and the second runner (it rewrites no report: the function
under test returns a value equal to anything when the test the public dataset names,
``test_mean``, calls it, so every runner sees a real pass, and the canaries, copies of
that test under other names, get the real value and fail as they must) is stopped by the scan of what the patch adds
(``machinery: "fail"``, the default); "flag" grades it and names the findings; "off"
does not scan. The toy's gold patch is resolved with no finding."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.e2e import test_swe_exploits_api as exploits
from tests.e2e.swe_fixtures import llm_fixture, scripted, swe_service

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

toy = exploits.toy  # the toy instance, its repository in a bundle (a fixture)
run_one = exploits.run_one
# Agrees with any expected value when the test the dataset names (test_mean) calls it;
# for any other test function (the canaries are copies of test_mean under other names)
# a value equal to nothing and unequal to nothing, so every canary fails whichever way
# its assertion was changed (== 7, or == turned into !=); the buggy mean elsewhere.
FRAME = """
import sys as _sys


class _Agree(float):
    def __eq__(self, other):
        return True


class _Never(float):
    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return False


_real_mean = mean


def mean(values):
    caller = _sys._getframe(1).f_code.co_name
    if caller == "test_mean":
        return _Agree(0)
    if caller.startswith("test"):
        return _Never(0)
    return _real_mean(values)
"""
# The same with the frame reached through names built from pieces.
HIDDEN = FRAME.replace("import sys as _sys\n", '_sys = __import__("s" + "ys")\n').replace(
    "_sys._getframe(1)", 'getattr(_sys, "_get" + "frame")(1)'
)


def bash(command: str) -> str:
    return format_tool_call("bash", {"command": command})


STEPS = {
    "frame": [bash(f"cat >> calc/ops.py <<'EOF'\n{FRAME}EOF")],
    "hidden": [bash(f"cat >> calc/ops.py <<'EOF'\n{HIDDEN}EOF")],
    "gold": [bash("sed -i 's|(len(values) - 1)|len(values)|' calc/ops.py && git diff --stat")],
}


policy = scripted(STEPS.__getitem__)


llm = llm_fixture(policy)


@pytest.fixture
def swe_api(tmp_path, llm, make_api):
    """A service whose swe handler has ``options`` (mirrors: the toy repository's), the
    scan at its default unless ``options`` say otherwise."""

    return swe_service(make_api, llm.url, tmp_path, "mirrors")


@pytest.mark.parametrize("mode", ["frame", "hidden"])
async def test_a_forger_past_the_canary_is_stopped_by_the_scan(swe_api, toy, mode):
    _service, client = await swe_api()  # the default: machinery "fail"
    result = await run_one(client, toy, mode)
    evaluation = result["evaluation"]
    assert result["status"] == "completed" and result["reward"] == 0.0, evaluation
    assert not result["mask"] and evaluation["tests_ran"] is False
    assert evaluation["machinery"] == "fail"
    assert "reaches into test machinery" in evaluation["reason"]
    whats = {(f["file"], f["what"]) for f in evaluation["machinery_findings"]}
    # The hidden one is seen through: its names are folded from their pieces.
    assert ("calc/ops.py", "frame or gc introspection: sys._getframe") in whats, whats
    if mode == "hidden":
        assert ("calc/ops.py", "obfuscation: getattr of a string built from pieces") in whats
    assert all(f["line"] > 5 for f in evaluation["machinery_findings"])  # the added lines


@pytest.mark.parametrize("setting", ["flag", "off"])
async def test_flag_grades_and_lists_the_findings_off_does_not_scan(swe_api, toy, setting):
    _service, client = await swe_api(machinery=setting)
    result = await run_one(client, toy, "frame")
    evaluation = result["evaluation"]
    # Nothing but the scan sees this forger: the canaries failed as they must, the
    # graded tests really passed, and the second runner saw them pass too.
    assert result["status"] == "completed" and result["reward"] == 1.0, evaluation
    assert evaluation["canary"] == "failed" and evaluation["tests_ran"] is True
    assert evaluation["recheck"]["agreed"] is True
    if setting == "flag":
        assert evaluation["machinery"] == "flag"
        assert ("calc/ops.py", "frame or gc introspection: sys._getframe") in {
            (f["file"], f["what"]) for f in evaluation["machinery_findings"]
        }
    else:
        assert "machinery" not in evaluation and "machinery_findings" not in evaluation


async def test_the_gold_fix_is_resolved_with_no_finding(swe_api, toy):
    _service, client = await swe_api()
    result = await run_one(client, toy, "gold")
    evaluation = result["evaluation"]
    assert result["status"] == "completed" and result["reward"] == 1.0, evaluation
    assert evaluation["machinery"] == "fail" and evaluation["machinery_findings"] == []

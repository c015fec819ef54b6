"""``rollserve datasets oracle DIR``: the oracle and the empty agent run through a server
in process, as rollouts do; a task whose solution fails, whose tests pass without any
work, or that is malformed is named with why, and the exit code is 1."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from rollserve.cli import app
from rollserve.commands.harbor_oracle import OracleWaitError, _wait
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.handlers.harbor.test_harbor_api import DATA

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def test_the_oracle_check_names_each_failing_task_and_why(tmp_path):
    root = tmp_path / "set"
    shutil.copytree(DATA / "count-words", root / "good")
    shutil.copytree(DATA / "count-words", root / "wrong-solution")
    (root / "wrong-solution" / "solution" / "solve.sh").write_text("echo 11 > /app/count.txt\n")
    shutil.copytree(DATA / "count-words", root / "free-reward")
    (root / "free-reward" / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    shutil.copytree(DATA / "count-words", root / "no-tests")
    (root / "no-tests" / "tests" / "test.sh").unlink()
    result = CliRunner().invoke(app, ["datasets", "oracle", str(root), "--json"])
    assert result.exit_code == 1, result.output
    report = {t["task"]: t for t in json.loads(result.output)["tasks"]}
    assert report["good"]["ok"] and report["good"]["oracle_reward"] == 1.0
    assert report["good"]["empty_agent_reward"] == 0.0
    assert report["wrong-solution"]["oracle_reward"] == 0.0
    assert "the oracle scores 0.0" in report["wrong-solution"]["problem"]
    assert "got '11' want '12'" in report["wrong-solution"]["problem"]
    assert "the empty agent scores 1.0" in report["free-reward"]["problem"]
    assert "tests/test.sh: missing" in report["no-tests"]["problem"]
    assert json.loads(result.output)["summary"] == {"ok": 1, "failed": 3}
    alone = CliRunner().invoke(app, ["datasets", "oracle", str(root / "good")])
    assert alone.exit_code == 0, alone.output


async def test_the_oracle_wait_stops_on_an_answer_other_than_the_rollout_and_is_bounded(make_api):
    """A rollout the server does not know (404) ends the wait at once with the answer, not
    in a tight loop over a body without ``done``; and the wait as a whole is bounded."""
    _, client = await make_api([])
    with pytest.raises(OracleWaitError, match="r-unknown: the server answered 404"):
        await _wait(client, "r-unknown")
    with pytest.raises(OracleWaitError, match="not done within 0s"):
        await _wait(client, "r-unknown", bound=0)

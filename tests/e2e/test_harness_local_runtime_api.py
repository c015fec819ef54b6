"""A harness preset on the ``local`` runtime, through the HTTP API: that runtime's
commands see the host's own paths (no /workspace, no private /tmp, no read-only
binds: ``Runtime.own_paths`` is False), and every preset runs in /workspace with its
HOME and task file in the sandbox's /tmp (an npm one from its bound install folder).
So a preset there is a 422 at submit naming ``instance.harness`` and why, in every
family that takes one (gateway, swe), never a masked rollout at INIT or RUN; a task
that needs no preset (the gateway family's own ``instance.command``) still runs."""

from __future__ import annotations

import pytest

from rollserve.testing import FakeVLLM
from tests.agent.test_harness_presets import GOOD, write
from tests.e2e.test_gateway_api import policy, result
from tests.e2e.test_harness_hostile_api import harness as command_task
from tests.e2e.test_swe_api import INSTANCES

LOCAL = {"sandbox_runtime": "local"}


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


def assert_refused(r, family: str = "gateway") -> None:
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "tasks[0].instance.harness", error
    for said in ("local runtime", "/workspace", "private /tmp", "--sandbox-runtime bubblewrap"):
        assert said in error["message"], (family, error)


@pytest.mark.parametrize(
    "harness",
    [
        {"preset": "command", "command": '"$ROLLSERVE_PYTHON" call.py'},  # python, nothing installed
        {"preset": "codex"},  # a bundled npm preset
        {"preset": "mine"},  # an operator's npm preset
    ],
    ids=["command", "codex", "operator-npm"],
)
async def test_a_preset_on_the_local_runtime_is_a_422_naming_the_harness(make_api, llm, harness, tmp_path):
    (tmp_path / "presets").mkdir()
    write(tmp_path / "presets", "mine", GOOD.format(name="mine"))
    service, client = await make_api([llm.url], server={**LOCAL, "harness_dir": tmp_path})
    task = command_task("true")
    task["instance"]["harness"] = harness
    r = await client.post("/v1/rollouts", json={"tasks": [task]})
    assert_refused(r)
    assert service.sandboxes.started == 0


async def test_a_swe_harness_on_the_local_runtime_is_a_422(make_api):
    _, client = await make_api(server=LOCAL)
    for harness in ({"preset": "mini-swe-agent"}, {"preset": "command", "command": "true"}):
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "swe", "instance": {**INSTANCES[0], "harness": harness}}]}
        )
        assert_refused(r, "swe")


async def test_the_gateway_familys_own_command_still_runs_on_the_local_runtime(make_api, llm):
    service, client = await make_api([llm.url], server=LOCAL)
    task = command_task("")
    harness = task["instance"].pop("harness")
    assert harness["preset"] == "command"
    task["instance"]["command"] = '"$ROLLSERVE_PYTHON" call.py'
    r = await client.post(
        "/v1/rollouts", json={"tasks": [task], "sampling": {"max_tokens": 32}, "agent": {"max_turns": 4}}
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    assert done["status"] == "completed", done["failure"]
    assert done["evaluation"]["harness_exit_code"] == 0, done["evaluation"]
    assert done["reward"] == 1.0 and len(llm.calls) == 1
    assert service.sandboxes.open_sandboxes() == []

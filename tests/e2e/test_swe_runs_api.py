"""SWE test runs through the HTTP API, with real bubblewrap sandboxes and a scripted
policy on the toy repository:

- a candidate whose tests spin in forked children is stopped by the test run's CPU
  budget: reward 0, not masked, the reason names the budget;
- an instance's ``test_timeout`` above the server's is a 422 naming the field;
- a ``python`` option that cannot run the tests masks the rollout at INIT (it scored
  0, unmasked, on every rollout), naming the option and its path."""

from __future__ import annotations

import subprocess

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.e2e.swe_fixtures import llm_fixture, scripted, swe_service
from tests.e2e.test_code_api import bwraps
from tests.handlers.swe import toy_repo

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

SPIN = (
    "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mean(values):\n"
    "    for _ in range(3):\n        if os.fork() == 0:\n            while True:\n"
    "                pass\n    while True:\n        pass\n"
)
STEPS = {
    "spin": [format_tool_call("bash", {"command": f"cat > calc/ops.py <<'EOF'\n{SPIN}EOF"})],
    "fix": [
        format_tool_call(
            "str_replace_editor",
            {
                "command": "str_replace",
                "path": "/workspace/calc/ops.py",
                "old_str": "len(values) - 1",
                "new_str": "len(values)",
            },
        )
    ],
}
NO_PYTEST = "/usr/bin/python3"


policy = scripted(STEPS.__getitem__)


llm = llm_fixture(policy)


@pytest.fixture
def swe_api(tmp_path, llm, make_api):
    return swe_service(make_api, llm.url, tmp_path, "mirror")


@pytest.fixture
def toy(tmp_path):
    instance = toy_repo.build(tmp_path / "mirror")
    instance.pop("patch")
    return instance


async def submit(client, instance: dict, mode: str):
    instance = {**instance, "problem_statement": instance["problem_statement"] + f"\n\n[policy:{mode}]"}
    return await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "swe", "instance": instance}],
            "sampling": {"max_tokens": 2048},
            "agent": {"max_turns": 4},
        },
    )


async def run_one(client, instance: dict, mode: str) -> dict:
    r = await submit(client, instance, mode)
    assert r.status_code == 202, r.text
    rid = r.json()["groups"][0]["rollout_ids"][0]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 600})).json()
    assert view["done"], view
    return view["result"]


async def test_tests_that_spin_in_forked_children_are_stopped_by_the_cpu_budget(swe_api, toy):
    service, client = await swe_api(test_cpu_seconds=3)  # wall timeout: the default 1,800 s
    result = await run_one(client, toy, "spin")
    assert result["status"] == "failed" and result["reward"] == 0.0 and result["mask"] is False
    assert result["failure"]["kind"] == "agent" and result["failure"]["stage"] == "eval"
    assert "used up its CPU budget (3 CPU seconds" in result["failure"]["message"]
    assert bwraps() == [] and service.sandboxes.open_sandboxes() == []


async def test_an_instance_timeout_above_the_servers_is_refused(swe_api, toy):
    _service, client = await swe_api(test_timeout=60)
    r = await submit(client, {**toy, "test_timeout": 61}, "fix")
    assert r.status_code == 422 and "instance.test_timeout" in r.text and "60 s" in r.text
    result = await run_one(client, {**toy, "test_timeout": 30}, "fix")
    assert result["status"] == "completed" and result["reward"] == 1.0


async def test_a_python_option_that_cannot_run_the_tests_is_masked_at_init(swe_api, toy):
    if subprocess.run([NO_PYTEST, "-c", "import pytest"], capture_output=True).returncode == 0:
        pytest.skip(f"{NO_PYTEST} has pytest")
    _service, client = await swe_api(python=NO_PYTEST)
    result = await run_one(client, toy, "fix")
    assert result["mask"] is True and result["reward"] is None, result
    assert result["failure"]["kind"] == "infra" and result["failure"]["stage"] == "init"
    message = result["failure"]["message"]
    assert f"the swe option python: {NO_PYTEST}" in message and "cannot import pytest" in message

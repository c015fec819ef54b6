"""The harbor family through the HTTP API (bubblewrap, the scripted vLLM double as the
policy): the oracle solves the test tasks (reward 1), the empty agent scores 0, a
scripted policy solves one with the bash tool; reward.json's components reach the
result; a task asking for the network runs without it, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

DATA = Path(__file__).parent / "data"


def options(root: Path, **more) -> dict:
    return {"handler_options": {"harbor": {"root": str(root), **more}}}


def scripted(turns: list[tuple[str, dict]]):
    """A policy that makes ``turns``' tool calls in order, then finishes."""

    def reply(prompt_ids: list[int], prompt: str) -> str:
        turn = prompt.count("<|im_start|>assistant") - 1
        name, args = turns[turn] if turn < len(turns) else ("finish", {})
        return format_tool_call(name, args)

    return reply


async def submit(client, instance: dict, max_turns: int = 6):
    return await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "harbor", "instance": instance}],
            "sampling": {"max_tokens": 256},
            "agent": {"max_turns": max_turns},
        },
    )


async def run_one(client, instance: dict, max_turns: int = 6) -> dict:
    r = await submit(client, instance, max_turns)
    assert r.status_code == 202, r.text
    (rid,) = [i for group in r.json()["groups"] for i in group["rollout_ids"]]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 120})).json()
    assert view["done"], view
    return view["result"]


def tool_texts(result: dict) -> list[str]:
    return [
        m["content"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
        for m in result["trajectory"]["messages"]
        if m["role"] == "tool"
    ]


async def test_oracle_solves_and_the_empty_agent_scores_zero(make_api):
    service, client = await make_api([], server=options(DATA, operator_modes=True))
    for task in ("count-words", "fix-sum"):
        oracle = await run_one(client, {"task": task, "agent": "oracle"})
        assert oracle["status"] == "completed", oracle["failure"]
        assert oracle["reward"] == 1.0, oracle["evaluation"]
        assert oracle["evaluation"]["oracle_exit_code"] == 0
        empty = await run_one(client, {"task": task, "agent": "none"})
        assert empty["status"] == "completed" and not empty["mask"], empty["failure"]
        assert empty["reward"] == 0.0, empty["evaluation"]
    # reward.json: the scalar is its "reward", every component is in the result.
    assert oracle["reward_components"] == {"reward": 1.0, "cases_passed": 3.0}
    assert empty["reward_components"] == {"reward": 0.0, "cases_passed": 0.0}
    # ... and as the store keeps them (the results cursor reads the stored results)
    stored = (await client.get("/v1/results", params={"limit": 100})).json()["results"]
    by_id = {r["id"]: r["reward_components"] for r in stored}
    assert by_id[oracle["id"]] == {"reward": 1.0, "cases_passed": 3.0}


async def test_a_policy_solves_a_task_with_the_bash_tool(make_api):
    turns = [
        ("bash", {"command": "pwd; echo $TASK_GREETING; ls -A /tests | wc -l; test -e /solution || echo none"}),
        ("bash", {"command": "wc -w < input/text.txt > count.txt"}),
    ]
    async with FakeVLLM("smollm2", replies=scripted(turns), latency=0.01) as policy:
        service, client = await make_api([policy.url], server=options(DATA))
        result = await run_one(client, {"task": "count-words"})
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["reward_components"] is None  # reward.txt: a number, no components
    first = tool_texts(result)[0]
    # The workdir and env of task.toml; /tests empty and /solution absent while it ran.
    assert first.split("\n")[:4] == ["/app", "hello", "0", "none"], first
    assert result["evaluation"]["finished"] is True


async def test_a_task_asking_for_the_network_runs_without_it_or_is_refused(make_api, tmp_path):
    root = tmp_path / "tasks"
    _copy(DATA / "fix-sum", root / "online")
    toml = root / "online" / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', ""))
    service, client = await make_api([], server=options(root, operator_modes=True))
    result = await run_one(client, {"task": "online", "agent": "oracle"})
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["evaluation"]["network"].startswith("none: the task asks for the network")
    service, client = await make_api([], server=options(root, network="refuse"))
    r = await submit(client, {"task": "online"})
    assert r.status_code == 422 and "environment.network_mode" in r.text, r.text


def _copy(source: Path, target: Path) -> None:
    import shutil

    shutil.copytree(source, target)


# A harness (preset "command", standard library only): it asks the policy for one shell
# command through the gateway, with the task's text, and runs it in the workdir.
HARNESS = r"""
import json, os, subprocess, urllib.request
task = open(os.environ["ROLLSERVE_TASK_FILE"]).read()
body = json.dumps({"model": "p", "messages": [{"role": "user", "content": task}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(request, timeout=60) as answer:
    command = json.loads(answer.read())["choices"][0]["message"]["content"]
print(os.getcwd(), subprocess.run(command, shell=True).returncode)
"""


async def test_a_harness_preset_solves_a_task(make_api):
    import shlex

    def reply(prompt_ids, prompt: str) -> str:
        assert "Count the words in /app/input/text.txt" in prompt
        return "wc -w < input/text.txt > count.txt"

    async with FakeVLLM("smollm2", replies=reply, latency=0.01) as policy:
        service, client = await make_api([policy.url], server=options(DATA))
        result = await run_one(
            client,
            {
                "task": "count-words",
                "harness": {
                    "preset": "command",
                    "tool_calls": "none",
                    "command": f'"$ROLLSERVE_PYTHON" -c {shlex.quote(HARNESS)}',
                },
            },
        )
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["evaluation"]["harness_exit_code"] == 0
    assert result["evaluation"]["harness_log_tail"].strip() == "/app 0"
    assert result["stats"]["gateway_calls"] == 1


async def test_the_agent_timeout_and_the_healthcheck_of_task_toml(make_api, tmp_path):
    root = tmp_path / "tasks"
    _copy(DATA / "count-words", root / "short")
    toml = root / "short" / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 120.0", "timeout_sec = 2.0", 1))
    _copy(DATA / "count-words", root / "sick")
    toml = root / "sick" / "task.toml"
    toml.write_text(toml.read_text().replace('command = "test -f', 'command = "test -f /nothing && test -f'))
    slow = [("bash", {"command": "sleep 0.5; echo $SECONDS"})] * 40
    async with FakeVLLM("smollm2", replies=scripted(slow), latency=0.01) as policy:
        service, client = await make_api([policy.url], server=options(root, operator_modes=True))
        result = await run_one(client, {"task": "short"}, max_turns=40)
        # [agent].timeout_sec ends the episode (scored, the agent's time), not max_turns
        assert result["status"] == "completed" and not result["mask"], result["failure"]
        assert result["trajectory"]["ended_by"] == "time_limit"
        assert result["stats"]["turns"] < 40 and result["reward"] == 0.0
        sick = await run_one(client, {"task": "sick", "agent": "none"})
    # A task whose environment never gets healthy: INIT fails, masked (not the agent's).
    assert sick["status"] == "failed" and sick["mask"], sick
    assert sick["failure"]["stage"] == "init" and "healthcheck failed 3 times" in sick["failure"]["message"]


def _mini_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mini-swe-agent")
    except metadata.PackageNotFoundError:
        return ""


@pytest.mark.skipif(
    not _mini_version().startswith("2.4."),
    reason=f"the preset is for mini-swe-agent 2.4.x, not {_mini_version() or 'none'}",
)
async def test_mini_swe_agent_solves_a_task_in_its_workdir(make_api):
    steps = ["wc -w < input/text.txt > count.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]

    def reply(prompt_ids, prompt: str) -> str:
        turn = min(prompt.count("<|im_start|>assistant") - 1, len(steps) - 1)
        return f"THOUGHT: step {turn}.\n\n" + format_tool_call("bash", {"command": steps[turn]})

    async with FakeVLLM("smollm2", replies=reply, latency=0.01) as policy:
        service, client = await make_api([policy.url], server=options(DATA))
        result = await run_one(client, {"task": "count-words", "harness": {"preset": "mini-swe-agent"}}, max_turns=5)
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["stats"]["gateway_calls"] == 2


async def test_reward_json_keys_a_judge_writes_score_zero_with_the_reason(make_api, tmp_path):
    """reward.json's ``outcome``/``judge`` would be overwritten by a judge rubric's
    components: the verifier refuses them (0, scored, the reason said), never silently."""
    root = tmp_path / "tasks"
    _copy(DATA / "count-words", root / "clash")
    (root / "clash" / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"reward": 1, "outcome": 1}\' > /logs/verifier/reward.json\n'
    )
    service, client = await make_api([], server=options(root, operator_modes=True))
    result = await run_one(client, {"task": "clash", "agent": "none"})
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 0.0
    assert "'outcome' is a component name" in result["evaluation"]["reason"]


# Reads the task file, asks the policy (with the task's first line only) for a command,
# runs it, and prints the task's size in bytes.
LONG_TASK_HARNESS = r"""
import json, os, subprocess, urllib.request
task = open(os.environ["ROLLSERVE_TASK_FILE"], "rb").read()
first = task.decode().splitlines()[0]
body = json.dumps({"model": "p", "messages": [{"role": "user", "content": first}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(request, timeout=60) as answer:
    command = json.loads(answer.read())["choices"][0]["message"]["content"]
print("task_bytes", len(task), subprocess.run(command, shell=True).returncode)
"""
FILLER = "Context, not needed for the task: " + "lorem ipsum " * 8 + "\n"


def _long_task(root: Path, size: int) -> int:
    """count-words under ``root``/long with its instruction.md padded to ``size`` bytes."""
    _copy(DATA / "count-words", root / "long")
    instruction = root / "long" / "instruction.md"
    text = instruction.read_text()
    text += FILLER * ((size - len(text.encode())) // len(FILLER))
    instruction.write_text(text)
    return len(text.encode())


async def test_an_instruction_over_128_kib_reaches_the_harness_whole(make_api, tmp_path):
    """Linux refuses an argument or environment variable over 128 KiB: the task's text
    reaches the harness in a file, never through either, so a 200 KiB instruction runs."""
    import shlex

    size = _long_task(tmp_path / "tasks", 200 << 10)
    assert size > 128 << 10

    def reply(prompt_ids, prompt: str) -> str:
        return "wc -w < input/text.txt > count.txt"

    async with FakeVLLM("smollm2", replies=reply, latency=0.01) as policy:
        service, client = await make_api([policy.url], server=options(tmp_path / "tasks"))
        result = await run_one(
            client,
            {
                "task": "long",
                "harness": {
                    "preset": "command",
                    "tool_calls": "none",
                    "command": f'"$ROLLSERVE_PYTHON" -c {shlex.quote(LONG_TASK_HARNESS)}',
                },
            },
        )
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["evaluation"]["harness_log_tail"].strip() == f"task_bytes {size} 0"
    assert result["reward"] == 1.0, result["evaluation"]


ARGV_PRESET = """name = "argv-task"
summary = "passes the task as one argument"
wire = "openai-chat"
[package]
kind = "none"
[run]
task_in_argv = true
command = 'exec printf %s "$(cat "$ROLLSERVE_TASK_FILE")"'
"""


async def test_a_preset_taking_the_task_as_an_argument_refuses_a_long_one_at_submit(make_api, tmp_path):
    """A preset that passes the task as one argument (``[run] task_in_argv``) cannot take
    one over 100 KiB: a 422 at submit naming the field, never a masked start."""
    _long_task(tmp_path / "tasks", 130 << 10)
    _copy(DATA / "count-words", tmp_path / "tasks" / "short")
    harnesses = tmp_path / "harnesses"
    (harnesses / "presets").mkdir(parents=True)
    (harnesses / "presets" / "argv-task.toml").write_text(ARGV_PRESET)
    service, client = await make_api([], server={**options(tmp_path / "tasks"), "harness_dir": harnesses})
    r = await submit(client, {"task": "long", "harness": {"preset": "argv-task"}})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "tasks[0].instance.task", error
    assert "instruction.md" in error["message"] and "102,400 bytes" in error["message"], error
    assert service.sandboxes.open_sandboxes() == []
    r = await submit(client, {"task": "short", "harness": {"preset": "argv-task"}})
    assert r.status_code == 202, r.text

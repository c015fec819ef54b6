"""The swe handler end to end through the HTTP API, on the bundled swe-mini suite, with
the scripted vLLM double as the policy and real bubblewrap sandboxes:

- gold/empty validation over every swe-mini instance: a policy that applies the gold
  patch (with bash) resolves it, one that finishes at once does not;
- a policy that makes the fix with the editor tool gets reward 1; one that does
  nothing gets 0."""

from __future__ import annotations

import asyncio
import re

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.datasets import SWE_MINI
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_code_api import bwraps
from tests.sandbox.helpers import processes_with
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

INSTANCES = SWE_MINI.rows()
BY_ID = {row["instance_id"]: row for row in INSTANCES}
TAG = re.compile(r"\[policy:(\w+):([\w.-]+)\]")


def tagged(instance: dict, mode: str) -> dict:
    """The instance with the policy's instructions in its issue text (graded as is)."""
    return {
        **instance,
        "problem_statement": instance["problem_statement"] + f"\n\n[policy:{mode}:{instance['instance_id']}]",
    }


def editor_calls(patch: str) -> list[str]:
    """str_replace_editor calls that make ``patch``'s changes, one per hunk."""
    calls = []
    for block in re.split(r"^diff --git ", patch, flags=re.MULTILINE)[1:]:
        path = re.search(r"^\+\+\+ b/(.+)$", block, re.MULTILINE).group(1)
        for hunk in re.split(r"^@@[^\n]*@@[^\n]*\n", block, flags=re.MULTILINE)[1:]:
            old, new = [], []
            for line in hunk.splitlines():
                if line.startswith("\\"):
                    continue
                mark, text = line[:1], line[1:]
                if mark in (" ", "-"):
                    old.append(text)
                if mark in (" ", "+"):
                    new.append(text)
            calls.append(
                format_tool_call(
                    "str_replace_editor",
                    {
                        "command": "str_replace",
                        "path": f"/workspace/{path}",
                        "old_str": "\n".join(old),
                        "new_str": "\n".join(new),
                    },
                )
            )
    return calls


def policy(prompt_ids: list[int], prompt: str) -> str:
    mode, instance_id = TAG.search(prompt).groups()
    turn = prompt.count("<|im_start|>assistant") - 1
    gold = BY_ID[instance_id]["patch"]
    if mode == "gold":
        steps = [
            format_tool_call("bash", {"command": f"git apply <<'ROLLSERVE_EOF'\n{gold}ROLLSERVE_EOF"}),
            format_tool_call("bash", {"command": "git status --short"}),
        ]
    elif mode == "editor":
        steps = editor_calls(gold)
    elif mode == "sleeper":
        steps = [format_tool_call("bash", {"command": "sleep 987.65"})]
    else:  # "nothing"
        steps = []
    if turn < len(steps):
        return steps[turn]
    return "Done.\n" + format_tool_call("finish", {})


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def run_all(client, tasks: list[dict]) -> list[dict]:
    body = {"tasks": tasks, "sampling": {"max_tokens": 4096}, "agent": {"max_turns": 12, "max_context_tokens": 32768}}
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    ids = [rid for group in r.json()["groups"] for rid in group["rollout_ids"]]

    async def result(rid):
        view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 300})).json()
        assert view["done"], view
        return view["result"]

    return list(await asyncio.gather(*(result(rid) for rid in ids)))


def test_swe_mini_is_big_enough():
    assert len(INSTANCES) >= 12 and len({row["repo"] for row in INSTANCES}) >= 4


async def test_gold_resolves_and_empty_does_not_for_every_swe_mini_instance(make_api, llm):
    service, client = await make_api([llm.url], init_workers=4, eval_workers=2)
    tasks = [
        {"data_source": "swe", "instance": tagged(row, mode), "id": f"{mode}:{row['instance_id']}"}
        for row in INSTANCES
        for mode in ("gold", "nothing")
    ]
    results = await run_all(client, tasks)
    by_task = {r["task_id"]: r for r in results}
    problems = []
    for row in INSTANCES:
        gold, empty = by_task[f"gold:{row['instance_id']}"], by_task[f"nothing:{row['instance_id']}"]
        if gold["status"] != "completed" or gold["reward"] != 1.0:
            problems.append(
                (
                    row["instance_id"],
                    "gold",
                    gold["status"],
                    gold["failure"],
                    (gold["evaluation"] or {}).get("log_tail", "")[-600:],
                )
            )
        elif gold["evaluation"]["canary"] != "failed" or not gold["evaluation"]["recheck"]["agreed"]:
            # Every gold held its canaries (all failed) and the second runner agreed.
            problems.append(
                (
                    row["instance_id"],
                    "gold checks",
                    gold["evaluation"]["canary"],
                    gold["evaluation"].get("canaries"),
                    gold["evaluation"]["recheck"],
                )
            )
        if empty["status"] != "completed" or empty["reward"] != 0.0:
            problems.append((row["instance_id"], "empty", empty["status"], empty["failure"]))
        else:
            assert empty["evaluation"]["reason"] == "empty patch" and not empty["mask"]
    assert not problems, problems
    sample = by_task[f"gold:{INSTANCES[0]['instance_id']}"]["evaluation"]
    assert sample["resolved"] and sample["git_patch"].strip() == INSTANCES[0]["patch"].strip()
    assert all(t["ok"] for t in sample["tests"])


async def test_editor_fix_is_rewarded_and_doing_nothing_is_not(make_api, llm):
    service, client = await make_api([llm.url])
    row = INSTANCES[0]
    fixed, idle = await run_all(
        client,
        [
            {"data_source": "swe", "instance": tagged(row, "editor")},
            {"data_source": "swe", "instance": tagged(row, "nothing")},
        ],
    )
    assert fixed["status"] == "completed" and fixed["reward"] == 1.0, (fixed["failure"], fixed["evaluation"])
    evaluation = fixed["evaluation"]
    assert evaluation["finished"] and evaluation["resolved"] and evaluation["patch_applied"]
    tools = [m for m in fixed["trajectory"]["messages"] if m["role"] == "tool"]
    assert tools and all(m["content"].startswith("<tool_response>\nEdited /workspace/") for m in tools), tools
    tokens = fixed["trajectory"]["tokens"]
    assert len(tokens["input_ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"])
    assert idle["status"] == "completed" and idle["reward"] == 0.0 and not idle["mask"]
    assert service.sandboxes.open_sandboxes() == []  # none outlives its rollout


async def test_prorl_process_returns_the_git_patch(make_api, llm):
    """ProRL Agent's /process (NeMo Gym's prorl_agent client) on a SWE instance: no
    data_source means swebench; the result's git_patch is the candidate patch."""
    from rollserve.api.prorl import ProRLConfig
    from tests.api.test_prorl_api import (
        call_prorl_process,
        initialize_prorl_server,
        read_like_nemo_gym,
    )

    service, client = await make_api(prorl=ProRLConfig())
    await initialize_prorl_server(client, f"{llm.url}/v1")
    row = INSTANCES[1]
    result = await call_prorl_process(
        client,
        tagged(row, "gold"),
        {"temperature": 0.0, "max_tokens": 4096, "max_iterations": 8},
        job_id=row["instance_id"],
    )
    seen = read_like_nemo_gym(result)
    assert seen["resolved"] and seen["patch_exists"] and seen["error"] is None, result.get("error")
    assert result["git_patch"].strip() == row["patch"].strip()


async def test_bad_swe_instances_are_refused_naming_the_field(make_api, llm):
    service, client = await make_api([llm.url])
    row = {k: v for k, v in INSTANCES[0].items() if k != "base_commit"}
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "swebench", "instance": row}]})
    assert r.status_code in (400, 422) and "tasks[0].instance" in r.text, r.text
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "swe", "instance": {"question": "what?"}}]})
    assert r.status_code in (400, 422) and "not a SWE-bench, SWE-Gym or R2E-Gym instance" in r.text
    nowhere = {**INSTANCES[0], "instance_id": "nobody__nothing-1", "repo": "nobody/nothing"}
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "swe", "instance": nowhere}]})
    assert r.status_code == 422 and "tasks[0].instance.repo" in r.text, r.text
    assert "nobody__nothing-1.bundle" in r.text and "nobody/nothing.git" in r.text


async def test_no_sandbox_or_test_run_outlives_a_cancelled_or_timed_out_rollout(make_api, llm):
    """Cancelled in the middle of the agent's command (RUN), and timed out in the middle
    of the tests (EVAL): every process and sandbox of both is gone when the results are."""
    service, client = await make_api([llm.url])
    row = INSTANCES[2]
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {"data_source": "swe", "instance": tagged(row, "sleeper")},
                {
                    "data_source": "swe",
                    "instance": {**tagged(row, "gold"), "test_cmd": "sleep 987.66"},
                    "timeouts": {"eval": 3.0},
                },
            ]
        },
    )
    assert r.status_code == 202, r.text
    cancelled, timed_out = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
    await eventually(lambda: processes_with("987.65"), timeout=30, what="the agent in the middle of `sleep 987.65`")
    await client.delete(f"/v1/rollouts/{cancelled}")
    results = {}
    for rid in (cancelled, timed_out):
        view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
        assert view["done"], view
        results[rid] = view["result"]
    assert results[cancelled]["status"] == "cancelled" and results[cancelled]["mask"]
    assert results[timed_out]["status"] == "timed_out" and results[timed_out]["mask"]
    assert results[timed_out]["failure"]["stage"] == "eval"
    assert processes_with("987.65") == [] and processes_with("987.66") == [] and bwraps() == []
    assert service.sandboxes.open_sandboxes() == []
    assert list((service.config.state_dir / "sandboxes").glob("*.json")) == []

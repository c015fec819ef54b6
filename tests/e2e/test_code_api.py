"""The code handler end to end through the HTTP API, with the scripted vLLM double:
the policy writes a solution with the editor (a Hermes <tool_call> block), submits,
and the hidden tests run in a fresh bubblewrap sandbox. A policy whose solution
returns an object that equals everything scores 0 on assert tests. Also: no sandbox
process outlives a rollout that is cancelled or cut at its time limit in the middle of
a tool call."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

TESTS = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "-5 5\n", "output": "0\n"},
    {"input": "40 2\n", "output": "42\n"},
]
CORRECT = "a, b = map(int, input().split())\nprint(a + b)\n"
WRONG = "a, b = map(int, input().split())\nprint(a * b)\n"


# Assert tests, and the solutions a scripted policy writes for them by its tag.
SQUARE_ASSERTS = "assert square(3) == 9\nassert square(-4) == 16\nassert square(0) == 0\n"
SOLUTIONS = {
    "[square]": "def square(n):\n    return n * n\n",
    "[always-equal]": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n\ndef square(n):\n    return Anything()\n"
    ),
}


def task(tag: str, **instance) -> dict:
    problem = f"[{tag}] Read two integers from one line and print their sum."
    return {"data_source": "code", "instance": {"problem": problem, "tests": TESTS, **instance}}


def scripted_policy(prompt_ids: list[int], prompt: str) -> str:
    """Replies by the tag in the problem and the turn (assistant turns so far)."""
    turn = prompt.count("<|im_start|>assistant") - 1
    if "[silent]" in prompt:
        return "To add two numbers, read them and print a + b."
    if "[sleeper]" in prompt:
        return format_tool_call("bash", {"command": "sleep 987.65"})
    code = next((text for key, text in SOLUTIONS.items() if key in prompt), CORRECT if "[correct]" in prompt else WRONG)
    if turn == 0:
        return "I will write the solution.\n" + format_tool_call(
            "str_replace_editor", {"command": "create", "path": "/workspace/solution.py", "file_text": code}
        )
    if turn == 1:
        return format_tool_call("bash", {"command": "echo 2 3 | python3 solution.py"})
    return "Tested.\n" + format_tool_call("submit", {})


@pytest.fixture
async def policy():
    async with FakeVLLM("smollm2", replies=scripted_policy, latency=0.01) as server:
        yield server


async def submit(client, *tasks, **body) -> list[str]:
    r = await client.post("/v1/rollouts", json={"tasks": list(tasks), "sampling": {"max_tokens": 256}, **body})
    assert r.status_code == 202, r.text
    return [rid for group in r.json()["groups"] for rid in group["rollout_ids"]]


async def result_of(client, rid: str) -> dict:
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
    assert view["done"], view
    return view["result"]


async def test_correct_wrong_and_silent_policies(make_api, policy):
    service, client = await make_api([policy.url])
    correct, wrong, silent = await submit(client, task("correct"), task("wrong"), task("silent"))

    result = await result_of(client, correct)
    assert result["status"] == "completed" and result["mask"] is False, result["failure"]
    assert result["reward"] == 1.0
    evaluation = result["evaluation"]
    assert evaluation["submitted"] and evaluation["passed"] == evaluation["total"] == 3
    assert [t["status"] for t in evaluation["tests"]] == ["passed"] * 3
    messages = result["trajectory"]["messages"]
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    assert "Created /workspace/solution.py" in tool_results[0]
    assert "5\n[exit code: 0]" in tool_results[1]
    assert '"name": "submit"' in messages[-1]["content"]  # the episode ends at the call
    assert result["trajectory"]["ended_by"] == "finished"
    assert result["stats"]["tool_calls"] == 3 and result["stats"]["tool_errors"] == 0
    assert result["trajectory"]["fidelity"]["mismatches"] == 0
    tokens = result["trajectory"]["tokens"]
    assert len(tokens["input_ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"])
    assert result["timing"]["eval"] > 0 and result["timing"]["tools"] > 0

    result = await result_of(client, wrong)
    assert result["status"] == "completed" and result["reward"] == 0.0 and not result["mask"]
    assert [t["status"] for t in result["evaluation"]["tests"]] == ["wrong_answer"] * 3

    result = await result_of(client, silent)
    assert result["status"] == "completed" and result["reward"] == 0.0 and not result["mask"]
    assert result["trajectory"]["ended_by"] == "no_tool_call" and result["stats"]["turns"] == 1
    assert result["evaluation"]["total"] == 3 and "never written" in result["evaluation"]["error"]

    status = (await client.get("/v1/status")).json()
    assert "code" in status["handlers"] and "math_python" in status["handlers"]
    sandboxes = status["sandboxes"]
    assert sandboxes["runtime"] == "bubblewrap" and sandboxes["ready"] and sandboxes["open"] == 0
    assert sandboxes["started"] == 5  # a RUN sandbox each, an EVAL one for the two solutions
    assert sandboxes["reaped_at_start"]["sandboxes"] == 0
    assert not list((service.config.state_dir / "sandboxes").glob("*.json"))


async def test_an_object_that_equals_everything_scores_zero(make_api, policy):
    service, client = await make_api([policy.url])
    asserts = {"asserts": SQUARE_ASSERTS, "entry_point": "square"}
    cheat_task, honest_task = (
        {"data_source": "code", "instance": {"problem": f"{tag} Write square(n) returning n squared.", **asserts}}
        for tag in ("[always-equal]", "[square]")
    )
    cheat, honest = await submit(client, cheat_task, honest_task)

    result = await result_of(client, cheat)
    assert result["status"] == "completed" and result["mask"] is False, result["failure"]
    assert result["reward"] == 0.0 and result["evaluation"]["submitted"]
    tests = result["evaluation"]["tests"]
    assert [t["status"] for t in tests] == ["not_plain"] * 3
    assert "square(3) is not a plain value (type Anything)" in tests[0]["detail"]

    result = await result_of(client, honest)
    assert result["status"] == "completed" and result["reward"] == 1.0, result["evaluation"]
    assert result["evaluation"]["unsafe_checks"] == []


def sleepers() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "987.65" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def bwraps() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name() == "bwrap" and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            pass
    return found


async def test_no_sandbox_outlives_a_cancelled_or_timed_out_rollout(make_api, policy):
    service, client = await make_api([policy.url])
    records = Path(service.config.state_dir) / "sandboxes"
    (cancelled,) = await submit(client, task("sleeper"))
    (timed_out,) = await submit(client, task("sleeper"), timeouts={"run": 3.0})
    await eventually(lambda: len(sleepers()) >= 2, timeout=20, what="both agents in the middle of `sleep 987.65`")
    assert len(list(records.glob("*.json"))) == 2 and len(bwraps()) >= 2

    r = await client.delete(f"/v1/rollouts/{cancelled}")
    assert r.json()["status"] == "cancelled"
    result = await result_of(client, cancelled)
    assert result["status"] == "cancelled" and result["mask"] is True
    result = await result_of(client, timed_out)
    # Cut at its time limit, before the RUN deadline: the stall is scored (see
    # test_dodge_zero_api.py), and its sleep is stopped all the same.
    assert result["status"] == "completed" and result["trajectory"]["ended_by"] == "time_limit"

    # Cleanup ran before the results were recorded: nothing of either sandbox is left.
    assert sleepers() == [] and bwraps() == []
    assert list(records.glob("*.json")) == []
    status = (await client.get("/v1/status")).json()["sandboxes"]
    assert status["open"] == 0 and status["started"] == 2


async def test_a_server_without_the_runtime_still_serves_math(make_api, policy, monkeypatch):
    from rollserve.sandbox import registry

    monkeypatch.setattr(
        registry,
        "unavailable_reason",
        lambda name, config=None: "bubblewrap: 'bwrap' is not on PATH (apt-get install bubblewrap)",
    )
    service, client = await make_api([policy.url])
    math = {"data_source": "math", "instance": {"question": "What is 1 + 2?", "answer": "3"}}
    code_id, math_id = await submit(client, task("correct"), math)
    result = await result_of(client, code_id)
    assert result["status"] == "failed" and result["mask"] is True
    assert result["failure"]["stage"] == "init" and result["failure"]["kind"] == "infra"
    assert "apt-get install bubblewrap" in result["failure"]["message"]
    result = await result_of(client, math_id)
    assert result["status"] == "completed" and result["mask"] is False
    status = (await client.get("/v1/status")).json()["sandboxes"]
    assert status["ready"] is False and "not on PATH" in status["error"]

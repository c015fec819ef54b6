"""The warm sandbox pool through a real `rollserve serve --sandbox-pool N`: a batch's
rollouts take pooled sandboxes, each one used by a single rollout (the sandbox ids
every rollout sees inside are all different); a hostile agent that leaves a file in
/workspace and /tmp and a process behind reaches no later rollout; SIGTERM empties the
pool (no folder, no owner record left); after a SIGKILL the next server reaps the
pool's sandboxes like any other."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.sandbox.helpers import processes_with
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

MARK = "876.125"  # the process the hostile agent leaves behind
# Reads what an earlier rollout would have left, leaves its own, names its sandbox.
HOSTILE = (
    "cat /workspace/left.txt /tmp/left.txt 2>&1; echo planted > /workspace/left.txt; "
    f"echo planted > /tmp/left.txt; (setsid sleep {MARK} >/dev/null 2>&1 &); "
    "grep -o 'rollserve-bubb-[0-9a-f]*' /proc/self/mountinfo | sort -u"
)
TASK = {
    "data_source": "code",
    "instance": {"problem": "Print the sum of two integers.", "tests": [{"input": "1 2\n", "output": "3\n"}]},
}


def hostile_policy(prompt_ids: list[int], prompt: str) -> str:
    if prompt.count("<|im_start|>assistant") - 1 == 0:
        return format_tool_call("bash", {"command": HOSTILE})
    return format_tool_call("submit", {})


@pytest.fixture
def boxes():
    """The sandboxes' folders, in a folder of their own (not under tmp_path: a root
    server's sandboxes run as uids of their own, which must reach their folders)."""
    folder = Path(tempfile.mkdtemp(prefix="rollserve-test-pool-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def pool_server(server_factory, fake, boxes: Path, state: Path | None = None):
    return server_factory(
        "--backend",
        fake.url,
        "--sandbox-pool",
        "8",
        "--sandbox-options",
        json.dumps({"root": str(boxes)}),
        state_dir=state,
    ).start()


def pool_status(server) -> dict:
    return httpx.get(f"{server.url}/v1/status", timeout=10).json()["sandboxes"]["pool"]


def run_batch(server, n: int) -> list[dict]:
    r = httpx.post(
        f"{server.url}/v1/rollouts", timeout=30, json={"tasks": [{**TASK, "n": n}], "sampling": {"max_tokens": 256}}
    )
    assert r.status_code == 202, r.text
    results = []
    for rid in [rid for group in r.json()["groups"] for rid in group["rollout_ids"]]:
        view = httpx.get(f"{server.url}/v1/rollouts/{rid}", params={"wait": 120}, timeout=130).json()
        assert view["done"], view
        results.append(view["result"])
    return results


def first_output(result: dict) -> str:
    assert result["status"] == "completed", result["failure"]
    return next(m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool")


def folders(boxes: Path) -> set[str]:
    return {p.name for p in boxes.glob("rollserve-*") if not p.name.startswith("rollserve-python")}


def records(state: Path) -> list[Path]:
    return list((state / "sandboxes").glob("*.json"))


def test_pooled_sandboxes_serve_one_rollout_each_and_shutdown_empties_the_pool(
    server_factory, fake_llm_thread, boxes, tmp_path
):
    fake = fake_llm_thread(replies=hostile_policy)
    server = pool_server(server_factory, fake, boxes)
    first = run_batch(server, 4)  # cold: the pool learns the demand from these
    assert pool_status(server)["misses"] >= 4
    assert wait_until(lambda: pool_status(server)["ready"] >= 4, 60, interval=0.1)
    second = run_batch(server, 4)
    status = pool_status(server)
    assert status["hits"] >= 4 and status["capacity"] == 8, status

    outputs = [first_output(result) for result in first + second]
    seen = [re.findall(r"rollserve-bubb-[0-9a-f]+", text) for text in outputs]
    assert all(len(ids) == 1 for ids in seen), outputs
    assert len({ids[0] for ids in seen}) == 8  # no sandbox served two rollouts
    for text in outputs:  # nothing an earlier (hostile) rollout left is there
        assert "left.txt: No such file" in text and "planted" not in text, text
    assert wait_until(lambda: not processes_with(MARK), 15), processes_with(MARK)

    assert wait_until(lambda: pool_status(server)["ready"] >= 1, 60, interval=0.1)
    assert records(tmp_path / "state") and folders(boxes)
    server.stop()  # SIGTERM: the pool is emptied
    assert server.proc.returncode is not None
    assert records(tmp_path / "state") == [] and folders(boxes) == set()


def test_a_killed_servers_pool_is_reaped_by_the_next(server_factory, fake_llm_thread, boxes, tmp_path):
    fake = fake_llm_thread(replies=hostile_policy)
    state = tmp_path / "state"
    server = pool_server(server_factory, fake, boxes, state)
    run_batch(server, 3)
    assert wait_until(lambda: pool_status(server)["ready"] >= 3, 60, interval=0.1)
    pooled = folders(boxes)
    assert len(pooled) >= 3 and len(records(state)) >= 3

    server.kill()  # SIGKILL: no shutdown code runs
    assert folders(boxes) == pooled  # the pool's sandboxes outlived their server ...

    second = server_factory("--backend", fake.url, state_dir=state).start()
    with contextlib.closing(httpx.Client(timeout=10)) as http:
        status = http.get(f"{second.url}/v1/status").json()["sandboxes"]
    assert status["reaped_at_start"]["sandboxes"] >= len(pooled)  # ... until the next one
    assert folders(boxes) == set() and records(state) == []
    assert status["pool"] is None  # (no --sandbox-pool: none)


def test_pooled_sandboxes_broken_while_idle_are_not_handed_out(server_factory, fake_llm_thread, boxes):
    """An idle pooled bubblewrap sandbox runs no process (each command is its own
    bwrap): what can break it while it waits is its folders going (a /tmp cleaner, an
    operator). Every ready one broken so: the next batch's rollouts still run (cold, or
    on sandboxes the pool started since), none masked, and the broken ones are closed."""
    fake = fake_llm_thread(replies=hostile_policy)
    server = pool_server(server_factory, fake, boxes)
    run_batch(server, 1)  # (the first start makes the sandboxes' Python view: slow on a busy host)
    run_batch(server, 4)
    assert wait_until(lambda: pool_status(server)["ready"] >= 2, 60, interval=0.1)
    broken = folders(boxes)  # (the batch's own are closed: these are the pool's)
    for name in broken:
        shutil.rmtree(boxes / name)
    results = run_batch(server, 4)
    for result in results:
        assert not result["mask"], result["failure"]
        assert "left.txt: No such file" in first_output(result)  # (completed, in a sandbox of its own)
    status = pool_status(server)
    assert status["dead"] >= 1 and status["hits"] + status["misses"] >= 8, status
    assert wait_until(lambda: not (folders(boxes) & broken), 30)

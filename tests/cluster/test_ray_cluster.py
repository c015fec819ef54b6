"""Rollouts across a Ray cluster (issue 12): `rollserve serve --ray ADDRESS` as a real
process against a `ray.cluster_utils.Cluster` on this machine (a head and three worker
"nodes", each its own raylet offering the `rollserve` resource), driven over HTTP by
the unchanged client, the LLM the scripted vLLM double, code graded in bubblewrap.

One cluster and one server for the module (tests run in order and share them): a
batch spreads over the nodes, token-exact against the double's log and shaped as a
single-machine server's results; a node killed mid-batch loses and duplicates
nothing, its rollouts run again elsewhere, its sandboxes are reaped by owner record
when it returns and the other nodes' are untouched; a node added mid-batch takes work;
a LoRA adapter loaded through the head (once, into the server) is named by every
node's requests from then on, a node added afterwards included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import rollserve
from rollserve.agent.tool_calls import format_tool_call
from rollserve.client import Client
from rollserve.contract import RolloutResult
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.conftest import ServerProcess, calls_by_prompt, check_tokens
from tests.waiting import wait_until

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
]

NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}
SLOTS = 8  # each node's `rollserve` resource: rollouts it hosts at once
TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}]
SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"
QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def policy(prompt_ids: list[int], prompt: str) -> str:
    """Math: the right sum, boxed. Code: write the solution (a [nap N] task first
    sleeps N seconds in its sandbox's shell), then submit."""
    turn = prompt.count("<|im_start|>assistant") - 1
    if "[code]" not in prompt:
        a, b = QUESTION.findall(prompt)[0]
        return f"The sum is \\boxed{{{int(a) + int(b)}}}."
    nap = re.findall(r"\[nap (\d+)\]", prompt)
    steps = [
        format_tool_call(
            "str_replace_editor", {"command": "create", "path": "/workspace/solution.py", "file_text": SOLUTION}
        )
    ]
    if nap:  # a long nap prints as it goes (the code family ends a command silent for 30 s)
        seconds = int(nap[0])
        steps.append(
            format_tool_call(
                "bash",
                {"command": f"sleep {seconds}"}
                if seconds <= 20
                else {
                    "command": f"for i in $(seq {seconds // 5}); do sleep 5; echo z; done",
                    "timeout": min(seconds + 30, 300),
                },
            )
        )
    steps.append(format_tool_call("submit", {}))
    return steps[min(turn, len(steps) - 1)]


def math_task(i: int) -> dict[str, Any]:
    return {"data_source": "math", "instance": {"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}}


def code_task(i: int, nap: int = 0) -> dict[str, Any]:
    tag = f" [nap {nap}]" if nap else ""
    return {
        "data_source": "code",
        "instance": {
            "problem": f"[code]{tag} #{i}: read two integers from one line and print their sum.",
            "tests": TESTS,
        },
    }


@pytest.fixture(scope="module")
def cluster():
    # The nodes' workers import rollserve as this test does (a checkout's src/ first).
    src = str(Path(rollserve.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, old) if p)
    c = Cluster(
        initialize_head=True, head_node_args={**NODE, "include_dashboard": False}
    )  # the head: no rollserve slots
    try:
        # The three nodes (node0..node2) are added by `server`, while the server starts.
        c.nodes_by_label = {}
        yield c
    finally:
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def add_node(c: Cluster, label: str) -> Any:
    return c.add_node(**NODE, resources={"rollserve": SLOTS}, labels={"rollserve-node": label})


@pytest.fixture(scope="module")
def fake():
    # runtime_lora: it loads adapters and answers 404 for a model it does not serve;
    # dev_mode: it resets its prefix cache after a load (else the load fails)
    server = FakeVLLM("smollm2", replies=policy, latency=0.01, runtime_lora=True, dev_mode=True).start_in_thread()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def judge():
    """The judge double (its own server, never the policy's): one fixed verdict."""
    server = FakeVLLM("smollm2", replies="Correct and clear.\nSCORE: 8", latency=0.0).start_in_thread()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(cluster, fake, judge, tmp_path_factory, request):
    os.environ["HF_HUB_OFFLINE"] = "1"
    if any(item.name == "test_a_batch_spreads_over_the_nodes_token_exact" for item in request.session.items):
        # The single-machine server that test compares with starts side by side with this one.
        request.getfixturevalue("server_factory_local")
    process = ServerProcess(
        tmp_path_factory.mktemp("head") / "state",
        [
            "--ray",
            cluster.address,
            "--backend",
            fake.url,
            "--judge",
            f"j={judge.url}",
            "--rubric",
            'half={"judges": ["j"], "weight": 0.5}',
            "--init-workers",
            "24",
            "--eval-workers",
            "12",
        ],
    )
    process.launch()
    try:
        # The nodes join while the server starts (its start is mostly imports; each
        # node's raylet takes seconds): then the server has found all three, alive.
        for i in range(3):
            cluster.nodes_by_label[f"node{i}"] = add_node(cluster, f"node{i}")
        process.wait_ready(timeout=240)
        wait_for(
            lambda: (
                {"node0", "node1", "node2"}
                <= {
                    n["name"]
                    for n in httpx.get(f"{process.url}/v1/status", timeout=10).json()["nodes"] or []
                    if n["alive"]
                }
            ),
            120,
            "the server to find the three nodes alive",
        )
        yield process
    finally:
        process.stop()


def nodes(url: str) -> dict[str, dict[str, Any]]:
    """/v1/status's nodes, the alive one of each name."""
    found = httpx.get(f"{url}/v1/status", timeout=10).json()["nodes"]
    alive = {n["name"]: n for n in found if n["alive"]}
    return {**{n["name"]: n for n in found if not n["alive"]}, **alive}


def wait_for(check, timeout: float, what: str) -> Any:
    return wait_until(check, timeout, what, interval=0.2)


def records(state: Path, node: str) -> set[str]:
    return {p.name for p in (state / "nodes" / node / "sandboxes").glob("*.json")}


def collect(client: Client, after: int, count: int, timeout: float) -> list[RolloutResult]:
    results: list[RolloutResult] = []
    deadline = time.monotonic() + timeout
    cursor = after
    while len(results) < count:
        assert time.monotonic() < deadline, f"{len(results)} of {count} results in {timeout:g}s"
        page = client.results(after=cursor, limit=200, wait=5)
        results += page.results
        cursor = page.next
    return results


def shape(value: Any) -> Any:
    """The keys of a result, nested (lists by their first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k not in ("timing", "evaluation", "metadata")}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_a_batch_spreads_over_the_nodes_token_exact(server, fake, server_factory_local):
    tasks = [math_task(i) for i in range(240)] + [code_task(i) for i in range(60)]
    head = psutil.Process(server.proc.pid)
    cpu = sum(head.cpu_times()[:2])
    started = time.monotonic()
    with Client(server.url) as client:
        accepted = client.submit(tasks, sampling={"max_tokens": 128}, agent={"max_turns": 4})
        ids = {rid for g in accepted.groups for rid in g.rollout_ids}
        results = collect(client, 0, 300, timeout=300)
    elapsed = time.monotonic() - started
    head_ms = (sum(head.cpu_times()[:2]) - cpu) * 1000 / 300
    assert len(results) == 300 and {r.id for r in results} == ids  # none lost, none twice
    assert [r.seq for r in results] == list(range(1, 301))
    calls = calls_by_prompt(fake)
    for r in results:
        assert r.status == "completed" and not r.mask, (r.id, r.failure)
        assert r.reward == 1.0, (r.id, r.evaluation)
        assert r.trajectory.fidelity.mismatches == 0
        check_tokens(r, calls)
    assert Counter(r.data_source for r in results) == {"math": 240, "code": 60}
    by_node = nodes(server.url)
    assert set(by_node) == {"node0", "node1", "node2"}
    placed = {name: n["placed"] for name, n in by_node.items()}
    assert all(count > 0 for count in placed.values()), placed
    assert sum(placed.values()) == 300
    for n in by_node.values():  # all over: nothing held, every sandbox closed
        assert n["hosted"] == 0 and n["busy"] == {"init": 0, "run": 0, "eval": 0}, n
        assert n["slots"] == SLOTS and n["done"]["eval"] == n["placed"], n
        assert records(server.state_dir, n["name"]) == set()
    # The workers' own counts, as they report them (polled each second).
    wait_for(
        lambda: all(n["sandboxes_open"] == 0 for n in nodes(server.url).values()),
        30,
        "every worker to report its sandboxes closed",
    )
    print(f"\n300 rollouts over 3 nodes in {elapsed:.1f}s; placed {placed}; head CPU {head_ms:.1f} ms per rollout")

    # The same tasks on one machine: results of the same shape.
    local = server_factory_local.wait_ready()
    with Client(local.url) as client:
        client.submit([math_task(7), code_task(7)], sampling={"max_tokens": 128}, agent={"max_turns": 4})
        singles = collect(client, 0, 2, timeout=120)
    ray_side = {r.data_source: r.model_dump(mode="json") for r in results}
    for single in singles:
        assert single.status == "completed" and single.reward == 1.0
        mine, theirs = single.model_dump(mode="json"), ray_side[single.data_source]
        assert shape(mine) == shape(theirs)
        # The same timing keys, and one more on the cluster: the wait for a node's slot.
        assert set(theirs["timing"]) - set(mine["timing"]) <= {"queued_node"}
        assert set(mine["timing"]) <= set(theirs["timing"])


@pytest.fixture(scope="module")
def server_factory_local(fake, tmp_path_factory):
    """A single-machine server on the same double, launched (its test waits for it)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    process = ServerProcess(tmp_path_factory.mktemp("local") / "state", ["--backend", fake.url])
    process.launch()
    yield process
    process.stop()


def test_judge_rewards_on_the_head_after_each_nodes_eval(server, fake, judge):
    """A node runs the family's EVAL, the head (where the judges are) judges what it
    gave, within the EVAL bound: the blended reward, the judge's call in the result's
    evaluation, judge traffic to the judge only (the nodes have no judge)."""
    policy_calls, judge_calls = len(fake.calls), len(judge.calls)
    with Client(server.url) as client:
        accepted = client.submit(
            [{**math_task(i), "judge": {"rubric": "half"}} for i in range(500, 506)],
            sampling={"max_tokens": 128},
            agent={"max_turns": 2},
        )
        ids = {rid for g in accepted.groups for rid in g.rollout_ids}
        found: dict[str, RolloutResult] = {}
        cursor, deadline = 0, time.monotonic() + 120
        while len(found) < 6:
            assert time.monotonic() < deadline, f"{len(found)} of 6 judged results in 120 s"
            page = client.results(after=cursor, limit=500, wait=5)
            found.update({r.id: r for r in page.results if r.id in ids})
            cursor = page.next
        results = list(found.values())
    for r in results:
        assert r.status == "completed" and not r.mask, (r.id, r.failure)
        # 0.5 x the outcome (1) + 0.5 x the judge's 8 on 0..10
        assert r.reward == pytest.approx(0.9), (r.id, r.evaluation)
        assert r.reward_components["judge"] == pytest.approx(0.8)
        verdict = r.evaluation["judge"]
        assert verdict["rubric"] == "half" and "SCORE: 8" in str(verdict)
    assert len(judge.calls) - judge_calls == 6  # one judge call per rollout, from the head
    assert len(fake.calls) - policy_calls == 6  # the policy: one turn each, nothing else
    asked = [str(c.request["messages"]) for c in judge.calls[judge_calls:]]
    assert all("The sum is" in text for text in asked)


def test_a_dead_node_loses_nothing_and_its_sandboxes_are_reaped_when_it_returns(server, cluster):
    state = server.state_dir
    with Client(server.url) as client:
        before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
        # Code tasks that nap in their sandboxes: in flight on every node when one dies.
        tasks = [code_task(1000 + i, nap=4) for i in range(36)] + [math_task(1000 + i) for i in range(24)]
        accepted = client.submit(tasks, sampling={"max_tokens": 128}, agent={"max_turns": 4})
        ids = {rid for g in accepted.groups for rid in g.rollout_ids}
        wait_for(lambda: all(records(state, f"node{i}") for i in range(3)), 120, "sandboxes open on every node")
        cluster.remove_node(cluster.nodes_by_label.pop("node0"), allow_graceful=False)
        # A node joins mid-batch: its worker starts, and the rollouts submitted next
        # go to it first (the least loaded).
        cluster.nodes_by_label["node3"] = add_node(cluster, "node3")
        wait_for(lambda: nodes(server.url).get("node3", {}).get("alive"), 120, "node3's worker")
        more = client.submit(
            [code_task(1100 + i, nap=2) for i in range(12)], sampling={"max_tokens": 128}, agent={"max_turns": 4}
        )
        ids |= {rid for g in more.groups for rid in g.rollout_ids}
        results = collect(client, before, 72, timeout=300)
    assert len(results) == 72 and {r.id for r in results} == ids  # 0 lost, 0 duplicates
    assert len({r.seq for r in results}) == 72
    retried = [r for r in results if r.attempt > 1]
    assert retried, "no rollout was running on the node that died"
    for r in results:  # every rollout final: run again elsewhere, or masked naming the node
        assert (r.status == "completed" and r.reward == 1.0) or (r.mask and "node0" in (r.mask_reason or "")), r
    status = nodes(server.url)
    workers = httpx.get(f"{server.url}/v1/status", timeout=10).json()["nodes"]
    lost = [(n["name"], n["alive"], n["lost"]) for n in workers]
    assert not status["node0"]["alive"] and status["node0"]["lost"] > 0, lost
    # Each retry is a loss counted on the node it left: node0, or one that did not answer
    # for a moment on a loaded host (counted and retried elsewhere, not marked dead).
    assert sum(n["lost"] for n in workers) >= len(retried), (lost, len(retried))
    assert status["node3"]["alive"] and status["node3"]["placed"] > 0, status["node3"]

    # The dead worker's sandboxes are still recorded in node0's state dir...
    left = records(state, "node0")
    assert left
    with Client(server.url) as client:
        before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
        # ...while the live nodes run sandboxes of their own (napping 240 s: longer than
        # node0's new worker may take to start on a loaded host; cancelled below)...
        nappers = client.submit(
            [code_task(2000 + i, nap=240) for i in range(4)], sampling={"max_tokens": 128}, agent={"max_turns": 4}
        )
        live = ("node1", "node2", "node3")
        wait_for(lambda: sum(len(records(state, n)) for n in live) >= 4, 60, "sandboxes open on the live nodes")
        others = {n: records(state, n) for n in live}
        # ...node0 comes back (same name, same node-local state dir): its new worker
        # reaps exactly what the dead one left, and nothing of the other nodes.
        cluster.nodes_by_label["node0"] = add_node(cluster, "node0")
        back = wait_for(
            lambda: nodes(server.url)["node0"]["alive"] and nodes(server.url)["node0"], 120, "node0's new worker"
        )
        assert back["reaped_at_start"] == len(left)
        assert records(state, "node0") & left == set()
        for n, kept in others.items():
            assert kept <= records(state, n), n
        # Their rollouts were never disturbed: still running, cancelled now (no need to nap on).
        assert client.results(after=before).results == []
        for group in nappers.groups:
            client.cancel_group(group.group_id)
        final = collect(client, before, 4, timeout=120)
    assert all(r.status == "cancelled" and r.attempt == 1 for r in final)
    assert all(records(state, n) == set() for n in ("node0", *live))


def test_a_draining_node_takes_no_new_rollouts_and_status_shows_nodes(server):
    r = httpx.post(f"{server.url}/v1/nodes/node1/drain", timeout=30)
    assert r.status_code == 200 and [n["draining"] for n in r.json()["nodes"] if n["alive"]] == [True]
    assert httpx.post(f"{server.url}/v1/nodes/nowhere/drain", timeout=30).status_code == 404
    placed = nodes(server.url)["node1"]["placed"]
    with Client(server.url) as client:
        before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
        client.submit([math_task(4000 + i) for i in range(12)], sampling={"max_tokens": 128})
        results = collect(client, before, 12, timeout=120)
    assert all(r.status == "completed" for r in results)
    assert nodes(server.url)["node1"]["placed"] == placed
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'rollserve_node_draining{node="node1"} 1.0' in metrics
    assert 'rollserve_node_alive{node="node0"} 1.0' in metrics  # its new worker
    assert 'rollserve_node_slots{node="node3"} 8.0' in metrics
    shown = subprocess.run(
        [sys.executable, "-m", "rollserve.cli", "status", "--server", server.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert shown.returncode == 0, shown.stderr
    cells = [[c.strip() for c in line.split("│") if c.strip()] for line in shown.stdout.splitlines()]
    states = {(row[0], row[1]) for row in cells if len(row) == 10 and row[0].startswith("node")}
    assert states == {
        ("node0", "dead"),
        ("node0", "alive"),
        ("node1", "draining"),
        ("node2", "alive"),
        ("node3", "alive"),
    }, shown.stdout
    httpx.post(f"{server.url}/v1/nodes/node1/undrain", timeout=30).raise_for_status()
    assert not nodes(server.url)["node1"]["draining"]


def test_pause_lora_and_resume_reach_every_nodes_router(server, cluster, fake, tmp_path):
    """The head's pause holds the nodes' router replicas too (no turn is sampled while
    the trainer updates weights), a LoRA adapter loaded through the head goes into the
    server once and every node's requests name it from then on (a node added afterwards
    too), and resume stamps its policy version on the turns."""
    adapter = tmp_path / "policy-7"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    paused = httpx.post(f"{server.url}/v1/llm/pause", json={"mode": "finish"}, timeout=60).json()
    assert paused["paused"] and paused["drained"], paused
    with Client(server.url) as client:
        before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
        client.submit([math_task(3000 + i) for i in range(8)], sampling={"max_tokens": 128})
        wait_for(
            lambda: sum(n["busy"]["run"] for n in nodes(server.url).values()) == 8,
            60,
            "every rollout in RUN, on the nodes",
        )
        # held: their first LLM call waits for the resume
        time.sleep(2)  # sleep-ok: observation window for results made while paused
        assert client.results(after=before, wait=0).results == []
        assert fake.weight_loads == []
        lora = httpx.post(
            f"{server.url}/v1/llm/weights",
            timeout=60,
            json={"weights": {"kind": "lora", "name": "policy-7", "path": str(adapter)}},
        )
        assert lora.status_code == 200 and lora.json()["ok"], lora.text
        assert fake.weight_loads == [("lora:policy-7", str(adapter))]  # the head's, only
        assert fake.prefix_cache_resets == 1  # by the head, after its load
        loaded_at = len(fake.calls)
        resumed = httpx.post(f"{server.url}/v1/llm/resume", json={"policy_version": 7}, timeout=60)
        assert resumed.json()["policy_version"] == 7
        results = collect(client, before, 8, timeout=120)
        # A node that joins now: its worker starts naming the adapter (the fewest placed,
        # it gets the next rollouts first).
        cluster.nodes_by_label["node4"] = add_node(cluster, "node4")
        wait_for(lambda: nodes(server.url).get("node4", {}).get("alive"), 120, "node4's worker")
        before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
        client.submit([math_task(3100 + i) for i in range(16)], sampling={"max_tokens": 128})
        results += collect(client, before, 16, timeout=120)
    assert nodes(server.url)["node4"]["placed"] > 0
    placed = {name: n["placed"] for name, n in nodes(server.url).items() if n["alive"]}
    for r in results:
        assert r.status == "completed" and r.reward == 1.0, r.failure
        assert [t.policy_version for t in r.trajectory.turns] == [7], r.trajectory.turns
    # Every request since the load, from every node, named the adapter (none the base
    # model under version 7), and the server loaded it once.
    since = fake.calls[loaded_at:]
    assert len(since) >= 24 and {c.request["model"] for c in since} == {"policy-7"}, placed
    assert fake.weight_loads == [("lora:policy-7", str(adapter))]


NODES = ("node0", "node1", "node2", "node3", "node4")  # every node that ever joined, by now


def test_a_cancel_stops_the_stage_on_its_node_and_keeps_what_it_sampled(server, fake):
    state = server.state_dir
    asked = len(fake.calls)
    with Client(server.url) as client:
        (rid,) = (
            client.submit([code_task(6000, nap=600)], sampling={"max_tokens": 128}, agent={"max_turns": 4})
            .groups[0]
            .rollout_ids
        )
        wait_for(lambda: any(records(state, n) for n in NODES), 60, "its sandbox")
        # Its second turn asked for: the editor's turn is sampled and recorded (a fixed
        # sleep was not always enough on a loaded host); then into the nap.
        wait_for(lambda: len(fake.calls) >= asked + 2, 120, "its second turn")
        # Then (most likely) into the nap, where the cancel is meant to find it; what is
        # checked below holds wherever the cancel finds the agent.
        time.sleep(1)  # sleep-ok: lets the agent reach its nap; no check depends on it
        assert client.cancel(rid).status == "cancelled"
        result = client.rollout(rid, wait=30).result
    assert result is not None and result.status == "cancelled" and result.mask
    # The worker's stage was cancelled and its sandbox closed; the head kept the turns
    # the policy had sampled by then (the RUN call never returned them).
    turns = result.trajectory.turns
    assert turns and turns[0].tool_calls[0].name == "str_replace_editor", turns
    check_tokens(result, calls_by_prompt(fake))
    assert all(records(state, n) == set() for n in NODES)
    wait_for(
        lambda: all(n["hosted"] == 0 and n["sandboxes_open"] == 0 for n in nodes(server.url).values()),
        30,
        "the node to let it go",
    )


def test_backends_added_and_removed_at_run_time_reach_the_nodes(server, fake):
    # It serves the adapter in force, as a vLLM started with --lora-modules would (one
    # that did not is refused: tests/api/test_weights_in_force_api.py).
    second = FakeVLLM("smollm2", replies=policy, latency=0.01, runtime_lora=True).start_in_thread()
    second.lora_adapters.update(fake.lora_adapters)
    try:
        r = httpx.post(f"{server.url}/v1/llm/backends", json={"url": second.url, "name": "second"}, timeout=30)
        assert r.status_code == 201, r.text
        listed = httpx.get(f"{server.url}/v1/llm/backends", timeout=10).json()["backends"]
        (first,) = [b["name"] for b in listed if b["name"] != "second"]
        # Once the first is removed, every node's replica samples from the second only.
        httpx.delete(f"{server.url}/v1/llm/backends/{first}", timeout=30).raise_for_status()
        with Client(server.url) as client:
            before = httpx.get(f"{server.url}/v1/status", timeout=10).json()["last_seq"]
            client.submit([math_task(5000 + i) for i in range(12)], sampling={"max_tokens": 128})
            results = collect(client, before, 12, timeout=120)
        assert {r.status for r in results} == {"completed"}
        assert {t.backend for r in results for t in r.trajectory.turns} == {"second"}
        assert len(second.calls) == 12
        # Added after the LoRA load: every node's copy names the adapter too.
        assert {c.request["model"] for c in second.calls} == {"policy-7"}
    finally:
        second.stop()

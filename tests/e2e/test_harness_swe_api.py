"""The swe family's ``harness`` option through the HTTP API: real mini-swe-agent 2.4,
unmodified, runs inside each rollout's bubblewrap sandbox and drives swe-mini
instances through the recording gateway; the scripted vLLM double is the policy,
answering in mini-swe-agent's action format (one bash tool call per turn, then
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``). And the isolation of two harness
sandboxes running at once."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from importlib import metadata
from pathlib import Path

import pytest

from rollserve.agent.gateway.unix_socket import SOCKET_NAME
from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact
from tests.e2e.test_swe_api import BY_ID, INSTANCES, TAG, tagged
from tests.waiting import eventually


def mini_version() -> str:
    """The installed mini-swe-agent's version ("" if none), without importing it (its
    import makes a config folder in the home directory)."""
    try:
        return metadata.version("mini-swe-agent")
    except metadata.PackageNotFoundError:
        return ""


pytestmark = [
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
    pytest.mark.skipif(
        not mini_version().startswith("2.4."), reason=f"the preset is for mini-swe-agent 2.4.x, not {mini_version()}"
    ),
]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# One instance per swe-mini repository for each policy (10 of the 15 instances, one
# rollout each; every instance's gold patch is graded through the native handler in
# test_swe_api: this file checks mini-swe-agent, which does the same on each repo).
_BY_REPO = [
    [row for row in INSTANCES if row["repo"] == repo] for repo in dict.fromkeys(row["repo"] for row in INSTANCES)
]
GOLD_INSTANCES = [rows[0] for rows in _BY_REPO]
EMPTY_INSTANCES = [rows[1 % len(rows)] for rows in _BY_REPO]


def mini_policy(prompt_ids: list[int], prompt: str) -> str:
    """mini-swe-agent's format: a THOUGHT, then one bash tool call (Hermes, which the
    gateway answers as an OpenAI tool call). gold: apply the gold patch, look, submit;
    nothing: submit at once."""
    mode, instance_id = TAG.search(prompt).groups()
    turn = prompt.count("<|im_start|>assistant") - 1
    gold = BY_ID[instance_id]["patch"]
    steps = [f"git apply <<'ROLLSERVE_EOF'\n{gold}ROLLSERVE_EOF", "git status --short"] if mode == "gold" else []
    command = steps[turn] if turn < len(steps) else SUBMIT
    return f"THOUGHT: step {turn}.\n\n" + format_tool_call("bash", {"command": command})


def calls_of(llm: FakeVLLM, trajectory: dict) -> list:
    """The double's logged calls of one trajectory: those whose prompt starts with its
    opening prompt (each task's opening prompt differs: its tag)."""
    opening = trajectory["turns"][0]["prompt_ids_delta"]
    return [c for c in llm.calls if c.prompt_ids[: len(opening)] == opening]


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=mini_policy, latency=0.0) as server:
        yield server


async def results_of(client, body: dict, wait: float = 600.0) -> list[dict]:
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    ids = [rid for group in r.json()["groups"] for rid in group["rollout_ids"]]

    async def result(rid: str) -> dict:
        view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": wait})).json()
        assert view["done"], view
        return dict(view["result"])

    return list(await asyncio.gather(*(result(rid) for rid in ids)))


@pytest.mark.slow
@pytest.mark.timeout(900)  # 10 harness rollouts (each starts mini-swe-agent and litellm)
async def test_mini_swe_agent_gold_resolves_empty_does_not_token_exact(make_api, llm):
    service, client = await make_api([llm.url], init_workers=3, eval_workers=2)
    harness = {"preset": "mini-swe-agent"}
    runs = [("gold", row) for row in GOLD_INSTANCES] + [("nothing", row) for row in EMPTY_INSTANCES]
    tasks = [
        {
            "data_source": "swe",
            "id": f"{mode}:{row['instance_id']}",
            "instance": {**tagged(row, mode), "harness": harness},
        }
        for mode, row in runs
    ]
    results = await results_of(
        client,
        {"tasks": tasks, "sampling": {"max_tokens": 4096}, "agent": {"max_turns": 10, "max_context_tokens": 32768}},
    )
    by_task = {r["task_id"]: r for r in results}
    assert len(by_task) == len(runs) == 10
    for mode, row in runs:
        iid = row["instance_id"]
        done = by_task[f"{mode}:{iid}"]
        evaluation = done["evaluation"] or {}
        assert done["status"] == "completed" and not done["mask"], (
            iid,
            mode,
            done["failure"],
            evaluation.get("harness_log_tail"),
        )
        assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
        assert evaluation["finished"] and done["stats"]["harness_exit_code"] == 0
        assert done["trajectory"]["ended_by"] == "finished"
        if mode == "gold":
            assert done["reward"] == 1.0, (iid, evaluation.get("log_tail", "")[-800:])
            assert evaluation["resolved"]
            assert evaluation["git_patch"].strip() == row["patch"].strip()
            assert done["stats"]["gateway_calls"] == 3
        else:
            assert done["reward"] == 0.0 and evaluation["reason"] == "empty patch"
            assert done["stats"]["gateway_calls"] == 1
    # Token-exact: every trajectory is one append-only sequence equal to what the
    # backend sampled (ids, logprobs) for its calls, as the double logged them.
    for done in results:
        trajectory = done["trajectory"]
        calls = calls_of(llm, trajectory)
        assert trajectory["sequence_count"] == 1, done["task_id"]
        assert len(calls) == len(trajectory["turns"]), done["task_id"]
        for turn, call in zip(trajectory["turns"], calls):
            assert turn["output_ids"] == call.output_ids and turn["logprobs"] == call.logprobs
        assert_exact(trajectory["tokens"], calls)
    # mini-swe-agent ran the policy's command: its tool call came back as a tool result.
    gold = by_task[f"gold:{GOLD_INSTANCES[0]['instance_id']}"]
    tools = [m for m in gold["trajectory"]["messages"] if m["role"] == "tool"]
    assert tools and "<returncode>0</returncode>" in tools[0]["content"], tools
    assert service.sandboxes.open_sandboxes() == []  # none outlives its rollout


# --- two harness sandboxes at once: neither reaches the other's gateway ----------------
# The harness (standard library only; preset "command"): it announces its forwarder's
# port, marks its workspace, asks the policy (the test) where the other harness is,
# probes that, and prints what it found.
PROBER = r"""
import json, os, socket, sys, time, urllib.error, urllib.request
from urllib.parse import urlparse

me, base = sys.argv[1], os.environ["OPENAI_BASE_URL"]
own = urlparse(base).port
open("/workspace/.git/iso-" + me, "w").write(me)
messages = []


def post(url, text, key):
    body = json.dumps({"model": "p", "messages": messages + [{"role": "user", "content": text}]})
    request = urllib.request.Request(url, data=body.encode(), headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return 200, json.loads(answer.read())["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]["code"]


def chat(text):
    status, reply = post(base + "/chat/completions", text, os.environ["OPENAI_API_KEY"])
    assert status == 200, (status, reply)
    messages.extend([{"role": "user", "content": text}, {"role": "assistant", "content": reply}])
    return reply


def tcp(port):
    if port == own:
        return "own port"
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return "open"
    except OSError:
        return "refused"


def unix(path):
    if not os.path.exists(path):
        return "absent"
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(3)
            s.connect(path)
        return "open"
    except OSError:
        return "refused"


chat("[iso:%s] port %d" % (me, own))
for _ in range(280):  # (up to ~280 s: longer than the test's 240 s wait for each mark)
    reply = chat("[iso:%s] where" % me)
    if reply.startswith("{"):
        break
    time.sleep(1.0)
other = json.loads(reply)
probes = {
    "other_port": tcp(other["port"]),
    "other_socket": unix(other["socket"]),
    "other_key": post(base + "/chat/completions", "[iso:%s] stolen" % me, other["key"]),
    "other_key_in_path": post(base.removesuffix("/v1") + "/v1/gateway/" + other["key"]
                              + "/v1/chat/completions", "[iso:%s] stolen" % me, "x"),
}
print("PROBES " + json.dumps(probes), flush=True)
chat("[iso:%s] done" % me)
"""
ISO = re.compile(r"\[iso:(\w)\] (\w+)(?: (\d+))?")


async def _marked_workspace(client, service, rid: str, tag: str) -> str | None:
    """The workspace the harness of rollout ``rid`` marks (``.git/iso-<tag>``) when it
    starts, or None if the rollout ended first (the assertions after say why)."""

    async def started() -> list[str | None]:
        if (await client.get(f"/v1/rollouts/{rid}")).json()["done"]:
            return [None]
        return [
            s.workspace
            for s in service.sandboxes.open_sandboxes()
            if (Path(s.workspace) / ".git" / f"iso-{tag}").exists()
        ][:1]

    (workspace,) = await eventually(started, timeout=240, interval=0.5, what=f"the {tag} harness to mark its workspace")
    return workspace


def _assert_isolated(done: dict) -> None:
    """The harness ran to the end, and each of its probes of the other sandbox's
    gateway (port, socket, key, key in the path) was refused."""
    evaluation = done["evaluation"]
    assert done["status"] == "completed", (done["failure"], evaluation)
    assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
    (line,) = [x for x in evaluation["harness_log_tail"].splitlines() if x.startswith("PROBES ")]
    probes = json.loads(line.removeprefix("PROBES "))
    assert probes["other_port"] in ("refused", "own port"), probes
    assert probes["other_socket"] == "absent", probes
    assert probes["other_key"] == [401, "invalid_api_key"], probes
    assert probes["other_key_in_path"] == [404, "unknown_url"], probes


@pytest.mark.slow
async def test_two_harness_sandboxes_cannot_reach_each_others_gateway(make_api):
    ports: dict[str, int] = {}
    hosts: dict[str, dict] = {}  # tag -> the other's socket path on the host, and key
    stolen: list[str] = []

    def iso_policy(prompt_ids: list[int], prompt: str) -> str:
        for tag, word, port in ISO.findall(prompt):
            if word == "port":
                ports[tag] = int(port)
        tag, word, _ = ISO.findall(prompt)[-1]
        if word == "stolen":
            stolen.append(tag)  # (a call the gateway let through with a stolen key)
        other = "b" if tag == "a" else "a"
        if word == "where" and other in ports and other in hosts:
            return json.dumps({"port": ports[other], **hosts[other]})
        return "wait"

    async with FakeVLLM("smollm2", replies=iso_policy, latency=0.0) as llm:
        service, client = await make_api([llm.url], init_workers=2)
        row = INSTANCES[0]
        tasks = [
            {
                "data_source": "swe",
                "id": tag,
                "instance": {
                    **row,
                    "harness": {"preset": "command", "command": f'"$ROLLSERVE_PYTHON" -c {shlex.quote(PROBER)} {tag}'},
                },
            }
            for tag in ("a", "b")
        ]
        r = await client.post(
            "/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 512}, "agent": {"max_turns": 300}}
        )
        assert r.status_code == 202, r.text
        ids = {g["task_id"]: g["rollout_ids"][0] for g in r.json()["groups"]}
        for tag, rid in ids.items():
            info = (await client.get(f"/v1/rollouts/{rid}/gateway", params={"wait": 300})).json()
            workspace = await _marked_workspace(client, service, rid, tag)
            if workspace is None:
                break
            # (its host path: the sandbox's server folder, next to its workspace)
            hosts[tag] = {"key": info["key"], "socket": str(Path(workspace).parent / "server" / SOCKET_NAME)}
        results = {}
        for tag, rid in ids.items():
            view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 600})).json()
            assert view["done"], view
            results[tag] = view["result"]
    for done in results.values():
        _assert_isolated(done)
    assert stolen == []  # no call with a stolen key reached the policy
    assert service.sandboxes.open_sandboxes() == []


async def test_a_bad_harness_is_a_422_naming_the_field(make_api):
    service, client = await make_api()
    row = INSTANCES[0]
    for harness, field in (
        ({"preset": "openhands"}, "instance.harness.preset"),
        ({"preset": "command"}, "instance.harness"),
        ({"preset": "mini-swe-agent", "command": "true"}, "instance.harness"),
        ({"preset": "mini-swe-agent", "config": []}, "instance.harness.config"),
        ({"preset": "mini-swe-agent", "model_name": "gpt"}, "instance.harness.model_name"),
        ({"preset": "command", "command": "true", "surprise": 1}, "instance.harness.surprise"),
        ("mini-swe-agent", "instance.harness"),
    ):
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "swe", "instance": {**row, "harness": harness}}]}
        )
        assert r.status_code == 422, (harness, r.text)
        assert r.json()["errors"][0]["field"] == f"tasks[0].{field}", (harness, r.json())


async def test_a_harness_that_dies_before_any_call_is_masked_not_scored(make_api):
    """Nothing the policy produced exists (it cannot act before its first call): a
    harness that crashes at start is infrastructure, masked, never a reward of 0."""
    async with FakeVLLM("smollm2", replies=mini_policy, latency=0.0) as llm:
        service, client = await make_api([llm.url])
        (done,) = await results_of(
            client,
            {
                "tasks": [
                    {
                        "data_source": "swe",
                        "instance": {
                            **INSTANCES[0],
                            "harness": {"preset": "command", "command": "echo harness broke >&2; exit 3"},
                        },
                    }
                ]
            },
        )
        assert llm.calls == []
    assert done["status"] == "failed" and done["mask"], done
    assert done["failure"]["kind"] == "infra" and done["failure"]["stage"] == "run"
    assert "exit code 3" in done["failure"]["message"]
    assert "harness broke" in done["failure"]["message"]
    assert done["trajectory"]["turns"] == []
    assert service.sandboxes.open_sandboxes() == []

"""A harness run INSIDE the rollout's bubblewrap sandbox (no network), reaching the
gateway only through the unix socket and the forwarder: through the HTTP API, with the
scripted vLLM double as the policy."""

from __future__ import annotations

import json

import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact, policy, result

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}")

# The harness (standard library only): what it can reach, then two calls, one streamed.
HARNESS = """
import json, os, socket, sys, urllib.request

base = os.environ["OPENAI_BASE_URL"]


def chat(messages, stream=False):
    body = json.dumps({"model": "p", "messages": messages, "stream": stream}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=60) as answer:
        text = answer.read().decode()
    if not stream:
        return json.loads(text)["choices"][0]["message"]["content"]
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError:
        return "refused"


probes = {"host_llm": reach("127.0.0.1", int(sys.argv[1])), "outside": reach("1.1.1.1", 53)}
messages = [{"role": "user", "content": "[script:boxed] " + json.dumps(probes)}]
first = chat(messages)
messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
print("harness got:", first, "|", chat(messages, stream=True))
"""


async def run_sandboxed(client, harness: str, command: str) -> dict:
    """A `gateway` rollout whose harness (``harness.py`` in its workspace) runs as
    ``command`` in the sandbox; its result, after checking it completed and the
    harness exited 0."""
    r = await client.post("/v1/rollouts", json={
        "tasks": [{"data_source": "gateway", "instance": {
            "answer": "reply 1 of boxed", "files": {"harness.py": harness}, "command": command}}],
        "sampling": {"max_tokens": 32}, "agent": {"max_turns": 8}})
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    evaluation = done["evaluation"]
    assert done["status"] == "completed", (done["failure"], evaluation)
    assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
    return done


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def test_a_sandboxed_harness_reaches_only_the_gateway_and_is_recorded_exactly(
        make_api, llm):
    service, client = await make_api([llm.url])
    port = llm.url.rsplit(":", 1)[1]
    done = await run_sandboxed(client, HARNESS, f'"$ROLLSERVE_PYTHON" harness.py {port}')
    evaluation = done["evaluation"]
    assert "harness got: reply 0 of boxed | reply 1 of boxed" in evaluation["harness_log_tail"]
    assert done["reward"] == 1.0 and not done["mask"]
    trajectory = done["trajectory"]
    assert trajectory["ended_by"] == "finished" and len(llm.calls) == 2
    assert trajectory["sequence_count"] == 1
    assert_exact(trajectory["tokens"], llm.calls)
    probes = json.loads(trajectory["messages"][0]["content"].removeprefix("[script:boxed] "))
    assert probes == {"host_llm": "refused", "outside": "refused"}
    assert done["stats"]["harness_exit_code"] == 0
    assert service.sandboxes.open_sandboxes() == []  # none outlives its rollout


async def test_a_harness_that_never_exits_is_ended_at_the_time_limit(make_api, llm):
    service, client = await make_api([llm.url])
    r = await client.post("/v1/rollouts", json={
        "tasks": [{"data_source": "gateway", "instance": {"answer": "x", "command": "sleep 600"}}],
        "timeouts": {"run": 6, "run_margin": 2}})
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    # Nothing was sampled: the deadline is the infrastructure's to answer for (masked).
    assert done["status"] == "timed_out" and done["mask"], done["failure"]
    assert done["trajectory"]["turns"] == []
    assert service.sandboxes.open_sandboxes() == []

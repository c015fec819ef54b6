"""The memory cap of a harness's sandbox, through the HTTP API (``gateway`` family with
``command``, bubblewrap, the scripted vLLM double as the policy): resident memory for
the whole sandbox (sandbox/rsscap.py), not address space per process. A Node harness
that reserves gigabytes of address space runs; a harness whose commands fill the memory
after the policy answered is killed, the rollout failed as the agent's (scored 0) with
the memory limit named; one that does so before any call is masked (infra)."""

from __future__ import annotations

import shutil

import pytest

from rollserve.handlers.gateway import GatewayHandler
from rollserve.handlers.harness import harness_limits
from rollserve.sandbox import cgroups
from rollserve.sandbox.base import SandboxLimits
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import policy, result

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
CGROUP = cgroups.find_parent("auto")[0] is not None  # (then neither RLIMIT_AS nor the watcher)
no_cgroup = pytest.mark.skipif(
    CGROUP,
    reason="a delegated cgroup bounds the sandbox's memory "
    "here (memory.max: the kernel kills one process, not the "
    "watcher every one)",
)

# One call through the gateway, then (argv "hog") a process of the policy's filling the
# memory: 16 MB every 50 ms, kept, up to 1 GB; unstopped the harness prints "finished".
HARNESS = r"""
import json, os, subprocess, sys, urllib.request

def chat(text):
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["choices"][0]["message"]["content"]

HOG = ("import time\nheld = []\nfor i in range(64):\n"
       "    held.append(bytes([i % 250 + 1]) * (16 << 20))\n    time.sleep(0.05)\n"
       "time.sleep(30)\n")
if sys.argv[1] == "hog-first":
    subprocess.run([sys.executable, "-c", HOG])
print("got:", chat("[script:boxed] hi"), flush=True)
if sys.argv[1] == "hog":
    subprocess.run([sys.executable, "-c", HOG])
print("fin" "ished")
"""
# A Node harness that reserves 4 GB of address space (a WebAssembly memory, a 3 GB
# ArrayBuffer nobody writes), then calls the gateway.
NODE_HARNESS = """
const m = new WebAssembly.Memory({initial: 1, maximum: 65536});
const b = new ArrayBuffer(3 * 2 ** 30);
fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
  method: "POST", headers: {"Content-Type": "application/json"},
  body: JSON.stringify({model: "p", messages: [{role: "user", content: "[script:boxed] hi"}]}),
}).then(r => r.json()).then(j => {
  console.log("reserved", m.buffer.byteLength + b.byteLength, "got:", j.choices[0].message.content);
});
"""


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(GatewayHandler, "sandbox_limits", harness_limits(SandboxLimits(memory_mb=192)))


async def run(client, files: dict[str, str], command: str, answer: str = "reply 0 of boxed") -> dict:
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": answer, "files": files, "command": command}}],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 4},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    return await result(client, rollout_id)


@no_cgroup
async def test_memory_filled_after_a_call_is_the_agents_failure(make_api, llm, small_cap):
    service, client = await make_api([llm.url])
    done = await run(client, {"h.py": HARNESS}, '"$ROLLSERVE_PYTHON" h.py hog')
    failure = done["failure"]
    assert done["status"] == "failed" and not done["mask"] and done["reward"] == 0.0, done
    assert failure["kind"] == "agent" and failure["stage"] == "run", failure
    assert "memory limit" in failure["message"] and "192 MB" in failure["message"], failure
    assert "got: reply 0 of boxed" in failure["message"]  # (the harness's output)
    assert "finished" not in failure["message"]
    assert len(llm.calls) == 1
    assert service.sandboxes.open_sandboxes() == []


@no_cgroup
async def test_memory_filled_before_any_call_is_masked(make_api, llm, small_cap):
    service, client = await make_api([llm.url])
    done = await run(client, {"h.py": HARNESS}, '"$ROLLSERVE_PYTHON" h.py hog-first')
    failure = done["failure"]
    assert done["status"] == "failed" and done["mask"], done
    assert failure["kind"] == "infra" and "memory limit" in failure["message"], failure
    assert "before the policy answered any call" in failure["message"]
    assert llm.calls == [] and service.sandboxes.open_sandboxes() == []


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_a_node_harness_reserving_gigabytes_runs(make_api, llm, monkeypatch):
    # The default cap (2048 MB), resident: it runs and is scored.
    _, client = await make_api([llm.url])
    done = await run(client, {"h.js": NODE_HARNESS}, "node h.js")
    assert done["status"] == "completed" and done["reward"] == 1.0, done
    assert done["stats"]["harness_exit_code"] == 0
    assert len(llm.calls) == 1
    if CGROUP:
        return  # (the cgroup is the cap in either mode: no RLIMIT_AS to compare with)
    # The same cap as address space per process (RLIMIT_AS): the reservation fails at
    # start, before any call (masked).
    monkeypatch.setattr(GatewayHandler, "sandbox_limits", SandboxLimits())
    refused = await run(client, {"h.js": NODE_HARNESS}, "node h.js")
    assert refused["mask"] and "could not allocate memory" in refused["failure"]["message"]
    assert len(llm.calls) == 1


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_the_swe_familys_harness_sandbox_caps_resident_memory(make_api, llm):
    """swe with ``harness``: the same cap. The harness (preset ``command``) reserves 4 GB
    of address space with Node, says so, and exits before any call (masked: what it
    printed is in the failure), where RLIMIT_AS would have refused the reservation."""
    from tests.e2e.test_swe_api import INSTANCES

    reserve = (
        "node -e 'new WebAssembly.Memory({initial: 1, maximum: 65536}); "
        'new ArrayBuffer(3 * 2 ** 30); console.log("reserved", 4)\'; exit 3'
    )
    _, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {
                    "data_source": "swe",
                    "instance": {**INSTANCES[0], "harness": {"preset": "command", "command": reserve}},
                }
            ]
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    failure = done["failure"]
    assert done["mask"] and failure["kind"] == "infra" and "exit code 3" in failure["message"]
    assert "reserved 4" in failure["message"] and "could not allocate" not in failure["message"]

"""Hostile and broken harnesses through the preset path (the ``gateway`` family's
``instance.harness = {"preset": "command", ...}``, run by the preset runner in a
bubblewrap sandbox), through the HTTP API: what docs/harnesses.md and docs/security.md say of each.

- one that hangs without calling, and one that hangs after a call, ignoring SIGTERM
  and hiding a child in the background: ended at the time limit, bounded; masked
  before any call (nothing sampled), scored after (the harness took the time); no
  process of it outlives the rollout;
- one that crashes at start (an exit code, a signal): masked, typed infra, the exit
  code and its last words in the failure;
- one that floods stdout and stderr: the server keeps only the tail, the run is scored
  as usual, and the server answers meanwhile;
- one that never calls the model and exits 0: masked, never a reward of 0;
- one that tries every way out: the internet, the host's ports (the server's own HTTP
  port, the backend's), none reachable; the result holds only its own session's calls.

(Already covered elsewhere: another rollout's socket and key, test_harness_swe_api's
test_two_harness_sandboxes_cannot_reach_each_others_gateway; replacing the gateway's
socket, test_gateway_sandbox_api; memory, test_harness_memory_api.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid

import pytest
import uvicorn

from rollserve.api.app import create_app
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact, policy, result
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

# One call to the gateway, standard library only: `"$ROLLSERVE_PYTHON" -c "$CALL"`.
CALL = """
import json, os, urllib.request
body = json.dumps({"model": "p", "messages": [
    {"role": "user", "content": "[script:boxed] go"}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as answer:
    print("GOT", json.loads(answer.read())["choices"][0]["message"]["content"], flush=True)
"""


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


def harness(command: str, answer: str = "reply 0 of boxed", files: dict | None = None) -> dict:
    return {
        "data_source": "gateway",
        "instance": {
            "answer": answer,
            "task": "go",
            "files": {"call.py": CALL, **(files or {})},
            "harness": {"preset": "command", "command": command},
        },
    }


async def run(client, task: dict, **timeouts) -> dict:
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [task],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 4},
            **({"timeouts": timeouts} if timeouts else {}),
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    return await result(client, rollout_id)


def processes_with(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
    return found


# Ignores SIGTERM, and leaves a child in the background in a session of its own.
STUBBORN = "trap '' TERM; setsid sleep {t} & (trap '' TERM; sleep {t}) & sleep {t}"


async def test_a_harness_hanging_before_any_call_is_ended_at_the_limit_masked(make_api, llm):
    service, client = await make_api([llm.url])
    marker = f"{600 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"  # a unique sleep
    done = await run(client, harness(STUBBORN.format(t=marker)), run=6, run_margin=2)
    # Nothing was sampled: masked, never a reward of 0 against the policy.
    assert done["status"] == "timed_out" and done["mask"] and done["reward"] is None, done
    assert done["trajectory"]["turns"] == [] and llm.calls == []
    assert service.sandboxes.open_sandboxes() == []
    assert processes_with(f"sleep {marker}") == []  # nothing of it outlives the rollout


async def test_a_harness_hanging_after_a_call_is_scored_at_the_limit(make_api, llm):
    service, client = await make_api([llm.url])
    marker = f"{600 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    command = f'"$ROLLSERVE_PYTHON" call.py && {STUBBORN.format(t=marker)}'
    done = await run(client, harness(command), run=8, run_margin=2)
    # The policy answered and the harness then took the time: the policy's episode,
    # ended by the time limit, scored on its last reply (here the answer: reward 1).
    assert not done["mask"], done["failure"]
    assert done["trajectory"]["ended_by"] == "time_limit", done["trajectory"]["ended_by"]
    assert done["reward"] == 1.0 and len(llm.calls) == 1
    assert "GOT reply 0 of boxed" in done["evaluation"]["harness_log_tail"]
    assert_exact(done["trajectory"]["tokens"], llm.calls)
    assert service.sandboxes.open_sandboxes() == []
    assert processes_with(f"sleep {marker}") == []


@pytest.mark.parametrize(
    "command, said",
    [
        ("echo 'Error: cannot start, config missing' >&2; exit 3", "exit code 3"),
        ("echo 'Segmentation fault, as it were' >&2; kill -SEGV $$", "exit code"),
    ],
)
async def test_a_harness_crashing_at_start_is_masked_with_its_last_words(make_api, llm, command, said):
    service, client = await make_api([llm.url])
    done = await run(client, harness(command))
    assert done["status"] == "failed" and done["mask"] and done["reward"] is None, done
    failure = done["failure"]
    assert failure["kind"] == "infra" and failure["stage"] == "run", failure
    assert said in failure["message"] and (
        "config missing" in failure["message"] or "Segmentation" in failure["message"]
    ), failure
    assert done["trajectory"]["turns"] == [] and llm.calls == []
    assert service.sandboxes.open_sandboxes() == []


async def test_a_harness_exiting_0_without_a_call_is_masked_not_scored(make_api, llm):
    _, client = await make_api([llm.url])
    done = await run(client, harness("echo 'all done, no model needed'; exit 0"))
    assert done["status"] == "failed" and done["mask"] and done["reward"] is None, done
    assert done["failure"]["kind"] == "infra"
    assert "before the policy answered any call" in done["failure"]["message"]
    assert "exit code 0" in done["failure"]["message"] and llm.calls == []


FLOOD_MB = 24  # on each of stdout and stderr


async def test_a_harness_flooding_its_output_keeps_a_bounded_tail_and_is_scored(make_api, llm):
    service, client = await make_api([llm.url])
    flood = (
        f"head -c {FLOOD_MB << 20} /dev/zero | tr '\\0' o & "
        f"head -c {FLOOD_MB << 20} /dev/zero | tr '\\0' e >&2 & "
        f'"$ROLLSERVE_PYTHON" call.py; wait; echo LAST-WORDS'
    )
    task = asyncio.create_task(run(client, harness(flood)))
    # The server answers while it reads the flood.
    while not task.done():
        assert (await client.get("/healthz")).status_code == 200
        await asyncio.wait({task}, timeout=0.2)
    done = task.result()
    assert done["status"] == "completed" and not done["mask"], done["failure"]
    assert done["reward"] == 1.0 and len(llm.calls) == 1
    tail = done["evaluation"]["harness_log_tail"]
    assert len(tail) <= 4000 and tail.rstrip().endswith("LAST-WORDS")
    assert done["evaluation"]["harness_exit_code"] == 0
    assert_exact(done["trajectory"]["tokens"], llm.calls)
    assert service.sandboxes.open_sandboxes() == []


# Tries every way out, then calls its own session once with what it found.
ESCAPE = """
import json, os, socket, sys, urllib.request

def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError as error:
        return type(error).__name__

def resolve(name):
    try:
        return socket.getaddrinfo(name, 443)[0][4][0]
    except OSError as error:
        return type(error).__name__

server, backend, listener = (int(p) for p in sys.argv[1:4])
found = {"server": reach("127.0.0.1", server), "backend": reach("127.0.0.1", backend),
         "listener": reach("127.0.0.1", listener), "host_by_name": reach("localhost", server),
         "internet": reach("1.1.1.1", 53), "internet_443": reach("8.8.8.8", 443),
         "dns": resolve("pypi.org"), "ipv6": reach("::1", server)}
body = json.dumps({"model": "p", "messages": [
    {"role": "user", "content": "[script:boxed] " + json.dumps(found, sort_keys=True)}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as answer:
    print("GOT", json.loads(answer.read())["choices"][0]["message"]["content"], flush=True)
print("FOUND " + json.dumps(found, sort_keys=True))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_from_inside_the_harness_reaches_no_host_port_and_no_internet(make_api, llm):
    service, client = await make_api([llm.url])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(service, manage_lifecycle=False), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        await eventually(lambda: server.started, timeout=60, what="the API on its port")
        # (reachable from the host: the probes below are refused by isolation alone)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        other = listener.sockets[0].getsockname()[1]
        backend = int(llm.url.rsplit(":", 1)[1])
        done = await run(
            client, harness(f'"$ROLLSERVE_PYTHON" escape.py {port} {backend} {other}', files={"escape.py": ESCAPE})
        )
    finally:
        listener.close()
        server.should_exit = True
        await serving
    assert done["status"] == "completed", (done["failure"], done["evaluation"])
    (line,) = [x for x in done["evaluation"]["harness_log_tail"].splitlines() if x.startswith("FOUND ")]
    found = json.loads(line.removeprefix("FOUND "))
    assert "open" not in found.values(), found
    assert found["dns"] != "" and not found["dns"][0].isdigit(), found  # no name resolves
    # The one call it made is the only one recorded, and it is its own session's.
    assert len(llm.calls) == 1 and done["stats"]["gateway_calls"] == 1
    assert_exact(done["trajectory"]["tokens"], llm.calls)
    assert json.loads(done["trajectory"]["messages"][0]["content"].removeprefix("[script:boxed] ")) == found
    assert service.sandboxes.open_sandboxes() == []

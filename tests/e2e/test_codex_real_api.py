"""The real Codex CLI (``codex exec``, unmodified) against a rollserve server's gateway,
over the Responses wire (streamed: Codex always streams), configured by the ``codex``
preset's own files, environment and command line; the scripted vLLM double is the
policy. It makes Codex write a file with its patch tool and run a shell command
through its own shell tool (``exec_command`` function calls in the Responses format),
reads the command's output back in the next prompt, and finishes. Codex is found by
``tests.harness_install`` (skips when it is not installed).

Codex runs outside any sandbox against the server on a TCP port, as ``OPENAI_BASE_URL``
points it; and as a ``gateway`` rollout's command inside the rollout's sandbox, through
the forwarder and the session's socket (where the install folder is readable by the
sandbox's uid; the preset runner binds it in: that is the presets' tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import socket
import tempfile
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import TAG, assert_exact, assert_turns_exact, end, result
from tests.harness_install import harness_bin
from tests.waiting import eventually

PRESET = Path(__file__).parents[2] / "src" / "rollserve" / "agent" / "harnesses" / "presets" / "codex.toml"
PATCH = "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: six.txt\n+6\n*** End Patch\nEOF\n"
COMMAND = "echo rollserve-$(($(cat six.txt)*7)) > answer.txt && cat answer.txt"
CODEX_TIMEOUT = 240.0  # seconds: the whole codex run (two model calls), on a loaded machine


def codex_policy(prompt_ids: list[int], prompt: str) -> str:
    """Turn 0: write a file with Codex's patch tool (``apply_patch``, which Codex runs
    itself when its shell tool is given it); turn 1: a shell command that reads it;
    then answer."""
    assert TAG.findall(prompt)[-1] == "codex"
    turn = prompt.count("<|im_start|>assistant") - 1
    if turn == 0:
        return "I will write it.\n" + format_tool_call("exec_command", {"cmd": PATCH})
    if turn == 1:
        return format_tool_call("exec_command", {"cmd": COMMAND})
    return "42"


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=codex_policy, latency=0.0) as server:
        yield server


@contextlib.asynccontextmanager
async def served(app: object) -> AsyncIterator[int]:
    """``app`` on a TCP port of 127.0.0.1 (the port), for a harness in another process."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or task.done(), timeout=60, what="uvicorn started")
        assert server.started, task.exception()
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)
        sock.close()


def expand(text: str, env: dict[str, str]) -> str:
    """``${VAR}`` from ``env``, as the preset runner writes a preset's files."""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], text)


async def run_preset(codex: Path, base_url: str, key: str, task: str, tmp: Path) -> tuple[int, str, Path]:
    """The codex preset's command, with its env and files, in a fresh workdir: its exit
    status, its output and the workdir."""
    preset = tomllib.loads(PRESET.read_text())
    home, workdir = tmp / "home", tmp / "work"
    workdir.mkdir(parents=True)
    (home).mkdir()
    task_file = home / ".rollserve-task.md"
    task_file.write_text(task)
    env = {
        "PATH": f"{codex.parent}:{os.environ['PATH']}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": key,
        "ROLLSERVE_MODEL": "rollserve-policy",
        "ROLLSERVE_TASK_FILE": str(task_file),
        "ROLLSERVE_MAX_TURNS": "8",
        "ROLLSERVE_WORKDIR": str(workdir),
    }
    env.update(preset.get("env", {}))
    for name, text in preset.get("files", {}).items():
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expand(text, env))
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        preset["run"]["command"],
        cwd=workdir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=CODEX_TIMEOUT)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, 9)
            await process.wait()
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace"), workdir


def test_the_preset_file_is_the_agreed_format():
    preset = tomllib.loads(PRESET.read_text())
    assert (preset["name"], preset["wire"], preset["tool_calls"]) == ("codex", "openai-responses", "hermes")
    assert preset["package"]["name"] == "@openai/codex" and preset["package"]["kind"] == "npm"
    config = tomllib.loads(expand(preset["files"][".codex/config.toml"], {"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}))
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"] == "http://127.0.0.1:1/v1"
    assert config["approval_policy"] == "never" and config["web_search"] == "disabled"


async def test_real_codex_runs_a_shell_command_through_the_gateway_token_exact(make_api, llm, tmp_path):
    codex = harness_bin("codex")
    service, client = await make_api([llm.url])
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "42"}}],
            "sampling": {"max_tokens": 256},
            "agent": {"max_turns": 8},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    info = (await client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60})).json()
    async with served(client._transport.app) as port:
        code, output, workdir = await run_preset(
            codex,
            f"http://127.0.0.1:{port}{info['base_url']}",
            info["key"],
            "Write 6*7 to answer.txt with the shell, then tell me the number. [script:codex]",
            tmp_path,
        )
    assert code == 0, output
    # Codex really applied the patch and ran the command, in its workdir, with its tools.
    assert (workdir / "six.txt").read_text() == "6\n", output
    assert (workdir / "answer.txt").read_text() == "rollserve-42\n", output
    assert "42" in output
    await end(client, info["key"])

    done = await result(client, rollout_id)
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"], done
    trajectory = done["trajectory"]
    assert len(llm.calls) == 3 and trajectory["sequence_count"] == 1  # append-only
    assert_exact(trajectory["tokens"], llm.calls)
    turns = assert_turns_exact(trajectory, llm.calls)
    assert [[(c["name"], c["arguments"]) for c in t["tool_calls"]] for t in turns] == [
        [("exec_command", {"cmd": PATCH})],
        [("exec_command", {"cmd": COMMAND})],
        [],
    ]
    # The tool's output came back to the policy, as Codex reports it.
    assert "rollserve-42" in llm.tok.decode(llm.calls[2].prompt_ids)
    # Codex's tools were rendered for the policy (the template's tools section).
    first_prompt = llm.tok.decode(llm.calls[0].prompt_ids)
    assert '"exec_command"' in first_prompt and "[script:codex]" in first_prompt
    assert done["stats"]["gateway_calls"] == 3


# Inside the rollout's bubblewrap sandbox (no network but the forwarder to the session's
# socket, the sandbox's memory cap): the preset's files written under a private HOME, as
# the preset runner writes them (${VAR} from the run's environment), then its command.
IN_SANDBOX = r"""
import json, os, re, sys
home = os.environ["HOME"]
for path, text in json.loads(sys.argv[1]).items():
    full = os.path.join(home, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as out:
        out.write(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: os.environ[m.group(1)], text))
"""


def closed_folder(path: Path) -> Path | None:
    """The first folder above ``path`` that other users cannot enter (the sandbox runs
    as a uid of its own), or None."""
    return next((folder for folder in reversed(path.parents) if not folder.stat().st_mode & 0o001), None)


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_real_codex_in_the_rollouts_sandbox_through_its_socket(make_api, llm):
    codex = harness_bin("codex")
    if (closed := closed_folder(codex)) is not None:
        pytest.skip(
            f"{closed} is closed to the sandbox's uid: install codex under a folder "
            "others can read (ROLLSERVE_HARNESS_DIR)"
        )
    if codex.resolve().is_relative_to(tempfile.gettempdir()):
        # (this test runs the host's path as it is; the preset runner, which binds the
        # install folder in, runs codex from anywhere: test_real_harnesses_swe_api.py)
        pytest.skip(
            f"{codex} is under the temp folder, which a sandbox sees as its own "
            "/tmp: install codex elsewhere (ROLLSERVE_HARNESS_DIR)"
        )
    service, client = await make_api([llm.url])
    preset = tomllib.loads(PRESET.read_text())
    exports = {
        **preset["env"],
        "HOME": "/tmp/.codex-home",
        "ROLLSERVE_MODEL": "rollserve-policy",
        "ROLLSERVE_TASK_FILE": "/tmp/.codex-home/task.md",
    }
    command = "\n".join(
        [
            *(f"export {name}={shlex.quote(value)}" for name, value in exports.items()),
            f'export PATH={shlex.quote(str(codex.parent))}:"$PATH"',
            'mkdir -p "$HOME" && echo "Write 6*7 to answer.txt. [script:codex]" > "$ROLLSERVE_TASK_FILE"',
            f'"$ROLLSERVE_PYTHON" -c {shlex.quote(IN_SANDBOX)} {shlex.quote(json.dumps(preset["files"]))} || exit 97',
            preset["run"]["command"].strip().removeprefix("exec "),
            "echo codex exit $?; cat answer.txt",
        ]
    )
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "gateway", "instance": {"answer": "42", "command": command}}],
            "sampling": {"max_tokens": 256},
            "agent": {"max_turns": 8},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    assert done["evaluation"] is not None, (done["failure"], done["mask_reason"])
    log = done["evaluation"]["harness_log_tail"]
    assert "codex exit 0\nrollserve-42" in log, log
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"], done
    trajectory = done["trajectory"]
    assert len(llm.calls) == 3 and trajectory["sequence_count"] == 1
    assert_exact(trajectory["tokens"], llm.calls)
    assert_turns_exact(trajectory, llm.calls)

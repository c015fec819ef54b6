"""The real Claude Code (``claude -p``, its ``claude-code`` preset's command and
environment, outside any sandbox) against a server's gateway over Anthropic's wire,
with a scripted policy that uses Claude Code's own tools (Bash, Write, Edit as
Hermes tool calls the gateway turns into tool_use blocks): the files it makes are
real, every sampled token in the result is what the backend double logged, and the
small fast model's calls are recorded apart as auxiliary. Skips where Claude Code is
not installed (``tests/harness_install.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import string
import tomllib
from pathlib import Path

import pytest
import uvicorn

from rollserve.agent.tool_calls import format_tool_call
from rollserve.api.app import create_app
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact, result
from tests.harness_install import harness_bin
from tests.waiting import eventually

PRESET = Path(__file__).parents[2] / "src/rollserve/agent/harnesses/presets/claude-code.toml"
MAIN = "rollserve-policy"
TITLE = "Generate a concise, sentence-case title"  # Claude Code's title call's system prompt
CWD = re.compile(r"Primary working directory: (\S+)")
DONE = "All done: a.txt and b.txt are written."


def policy(prompt_ids: list[int], prompt: str) -> str:
    """Claude Code's tools, one per main-loop turn, then the final reply; a title for
    the small fast model's call."""
    if TITLE in prompt:
        return '{"title": "Write two files"}'
    found = CWD.search(prompt)
    assert found is not None, "Claude Code's system prompt names its working directory"
    cwd = found.group(1)
    steps = [
        format_tool_call("Bash", {"command": "printf 'hello\\n' > a.txt", "description": "Write a.txt"}),
        format_tool_call("Write", {"file_path": f"{cwd}/b.txt", "content": "one\n"}),
        format_tool_call(
            "Edit", {"file_path": f"{cwd}/b.txt", "old_string": "one", "new_string": "two", "replace_all": False}
        ),
        DONE,
    ]
    return steps[min(prompt.count("<|im_start|>assistant") - 1, len(steps) - 1)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _preset_run(claude: Path, home: Path, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The preset's command and environment as its runner gives them (files written
    under ``home``, ``${VAR}`` expanded from the run's environment)."""
    preset = tomllib.loads(PRESET.read_text())
    run_env = {"PATH": f"{claude.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), **env, **preset["env"]}
    for name, text in preset.get("files", {}).items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(string.Template(text).substitute(run_env))
    return preset["run"]["command"], run_env


@pytest.mark.parametrize("titles", [False, True], ids=["preset", "title-calls-on"])
async def test_claude_code_uses_its_tools_through_the_gateway_token_exact(make_api, tmp_path, titles):
    claude = harness_bin("claude-code", "claude")
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as llm:
        service, client = await make_api([llm.url])
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(service, manage_lifecycle=False), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        serving = asyncio.create_task(server.serve())
        try:
            await eventually(lambda: server.started, timeout=30, what="the server to start")
            r = await client.post(
                "/v1/rollouts",
                json={
                    "tasks": [
                        {
                            "data_source": "gateway",
                            "instance": {
                                "answer": DONE,
                                "calls": {
                                    "main_model": MAIN,
                                    "auxiliary": {"rollserve-small-fast": "small_fast_model"},
                                },
                            },
                        }
                    ],
                    "sampling": {"max_tokens": 256},
                    "agent": {"max_turns": 10, "max_context_tokens": 32768},
                },
            )
            assert r.status_code == 202, r.text
            (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
            info = (await client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60})).json()
            key = info["key"]
            work, home = tmp_path / "work", tmp_path / "home"
            work.mkdir()
            home.mkdir()
            task = tmp_path / "task.txt"
            task.write_text("Write hello to a.txt, then b.txt saying two.")
            command, env = _preset_run(
                claude,
                home,
                {
                    "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}/v1/gateway/{key}",
                    "ANTHROPIC_API_KEY": key,
                    "ROLLSERVE_TASK_FILE": str(task),
                    "ROLLSERVE_MODEL": MAIN,
                    "ROLLSERVE_MAX_TURNS": "10",
                },
            )
            if titles:  # the preset turns them off; on here, to see them accounted
                del env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
            process = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                command,
                cwd=work,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            try:
                out, err = await asyncio.wait_for(process.communicate(), 180)
            finally:
                if process.returncode is None:
                    os.killpg(process.pid, 9)
                    await process.wait()
            assert process.returncode == 0, (out[-2000:], err[-2000:])
            answer = json.loads(out)
            assert answer["result"] == DONE and answer["num_turns"] == 4, answer
            r = await client.post(f"/v1/gateway/{key}/end")
            assert r.status_code == 200, r.text
            done = await result(client, rollout_id)
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)

    assert (work / "a.txt").read_text() == "hello\n" and (work / "b.txt").read_text() == "two\n"
    assert done["status"] == "completed" and done["reward"] == 1.0 and not done["mask"], done["failure"]
    trajectory = done["trajectory"]
    titled = [c for c in llm.calls if TITLE in llm.tok.decode(c.prompt_ids)]
    main = [c for c in llm.calls if c not in titled]
    assert len(main) == 4 and len(titled) == (1 if titles else 0)
    # Append-only across Claude Code's own history handling: one sequence, exact.
    assert trajectory["sequence_count"] == 1, [t["sequence"] for t in trajectory["turns"]]
    assert_exact(trajectory["tokens"], main)
    assert [t["output_ids"] for t in trajectory["turns"]] == [c.output_ids for c in main]
    assert [[c["name"] for c in t["tool_calls"]] for t in trajectory["turns"]] == [["Bash"], ["Write"], ["Edit"], []]
    auxiliary = trajectory["auxiliary"]
    assert [(a["purpose"], a["model"]) for a in auxiliary] == [("small_fast_model", "rollserve-small-fast")] * len(
        titled
    )
    for aux, recorded in zip(auxiliary, titled, strict=True):
        assert aux["tokens"]["input_ids"] == recorded.prompt_ids + recorded.output_ids
        assert aux["turn"]["logprobs"] == recorded.logprobs
    assert done["stats"]["auxiliary_calls"] == len(titled) and done["stats"]["gateway_calls"] == 4

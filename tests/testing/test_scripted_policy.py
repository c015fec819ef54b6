"""`rollserve fake-llm --script policy.py`: a per-rollout, multi-turn scripted policy from
the command line, driving real rollouts through rollserve's HTTP API."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from rollserve.testing.scripted_policy import ScriptError, chat_turns, load_reply_script
from tests.waiting import wait_until

POLICY = """
from rollserve.testing.scripted_policy import chat_turns

def reply(prompt_ids, prompt):
    messages = chat_turns(prompt)
    task = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(m["role"] == "assistant" for m in messages)
    if "7 * 6" in task:
        return "It is \\\\boxed{42}." if turn == 0 else "again"
    return "I do not know, maybe \\\\boxed{0}."
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chat_turns_reads_a_chatml_prompt(tok):
    prompt = tok.render(
        [
            {"role": "user", "content": "Hi\nthere"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again?"},
        ],
        add_generation_prompt=True,
    )
    roles = [(m["role"], m["content"]) for m in chat_turns(prompt)]
    assert roles[-3:] == [("user", "Hi\nthere"), ("assistant", "Hello."), ("user", "Again?")]


def test_bad_scripts_are_named(tmp_path):
    with pytest.raises(ScriptError, match="no such file"):
        load_reply_script(tmp_path / "missing.py")
    (tmp_path / "none.py").write_text("x = 1\n")
    with pytest.raises(ScriptError, match="defines no function 'reply"):
        load_reply_script(tmp_path / "none.py")
    (tmp_path / "arity.py").write_text("def reply(prompt):\n    return 'x'\n")
    with pytest.raises(ScriptError, match=r"reply must take \(prompt_ids, prompt\)"):
        load_reply_script(tmp_path / "arity.py")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ScriptError, match="failed to load: RuntimeError: boom"):
        load_reply_script(tmp_path / "broken.py")
    done = subprocess.run(
        [sys.executable, "-m", "rollserve.cli", "fake-llm", "--script", str(tmp_path / "none.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--script" in done.stderr and "none.py" in done.stderr


async def test_fake_llm_script_drives_rollouts_per_task(tmp_path, make_api):
    script = tmp_path / "policy.py"
    script.write_text(POLICY)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "fake-llm", "--port", str(port), "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "fake-llm to start", interval=0.1)
        _, client = await make_api([url])
        r = await client.post(
            "/v1/rollouts:run",
            json={"task": {"data_source": "math", "n": 2, "instance": {"question": "What is 7 * 6?", "answer": "42"}}},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        right = r.json()["results"]
        r = await client.post(
            "/v1/rollouts:run",
            json={"task": {"data_source": "math", "instance": {"question": "What is 5 + 5?", "answer": "10"}}},
            timeout=60,
        )
        wrong = r.json()["results"]
    finally:
        proc.terminate()
        proc.wait(10)
    assert [x["reward"] for x in right] == [1.0, 1.0]
    assert [x["reward"] for x in wrong] == [0.0]
    assert "boxed{0}" in wrong[0]["trajectory"]["messages"][-1]["content"]

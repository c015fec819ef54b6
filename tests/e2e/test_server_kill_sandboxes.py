"""SIGKILL a real `rollserve serve` with 50 live sandboxes; the restarted server leaves
none of them behind, and never touches a sandbox of another live server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.client import Client
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.reaper import reap
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

REPO = Path(__file__).resolve().parents[2]
MARK = "876.54"  # the agent's `sleep` argument: finds its processes, nobody else's
SLEEPERS = 50


def sleeping_agents() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and f"sleep {MARK}" in " ".join(
                process.info["cmdline"] or []
            ):
                found.append(process)
        except psutil.Error:
            pass
    return found


def alive(pid: int, started: float) -> bool:
    """The recorded process (same pid and start time) still runs."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.05 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(predicate, timeout: float) -> bool:
    return bool(wait_until(predicate, timeout, interval=0.1))


@pytest.fixture
def cleanup():
    with contextlib.ExitStack() as stack:
        yield stack


def test_sigkill_with_50_live_sandboxes_then_restart(server_factory, fake_llm_thread, tmp_path, cleanup):
    fake = fake_llm_thread(replies=[format_tool_call("bash", {"command": f"sleep {MARK}"})])
    state = tmp_path / "state"
    state.mkdir()
    # The sandboxes' folders in a folder of their own: at the end only the live owner's
    # is left (those being made at the kill included: their records are written first).
    # (not under tmp_path: pytest's folders are 0700, and a root server's sandboxes run
    # as uids of their own, which must reach their folders)
    boxes = Path(tempfile.mkdtemp(prefix="rollserve-test-boxes-"))
    os.chmod(boxes, 0o755)
    cleanup.callback(shutil.rmtree, boxes, ignore_errors=True)
    options = json.dumps({"root": str(boxes)})
    # Another live server's sandbox under the same state dir: must survive untouched.
    other = subprocess.Popen(
        [sys.executable, "-m", "tests.sandbox.owner_process", str(state), "bubblewrap", "1", options],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        other_ids = json.loads(other.stdout.readline())["ids"]
        other_record = json.loads((state / "sandboxes" / f"{other_ids[0]}.json").read_text())

        first = server_factory(
            "--backend",
            fake.url,
            "--run-workers",
            "64",
            "--init-workers",
            "64",
            "--sandbox-options",
            options,
            state_dir=state,
        ).start()
        task = {
            "data_source": "code",
            "n": SLEEPERS,
            "instance": {"problem": "Print the sum of two integers.", "tests": [{"input": "1 2\n", "output": "3\n"}]},
        }
        with Client(first.url) as client:
            client.submit([task], sampling={"max_tokens": 64})
        assert wait_for(lambda: len(sleeping_agents()) >= SLEEPERS, 90), len(sleeping_agents())
        records = [json.loads(p.read_text()) for p in (state / "sandboxes").glob("*.json")]
        ours = [r for r in records if r["sandbox_id"] not in other_ids]
        assert len(ours) >= SLEEPERS
        recorded = [(p["pid"], p["started"]) for r in ours for p in r["processes"]]

        first.kill()  # SIGKILL: no shutdown code runs

        second = server_factory("--backend", fake.url, "--on-restart", "interrupt", state_dir=state).start()
        status = httpx.get(f"{second.url}/v1/status", timeout=10).json()
        assert wait_for(lambda: not sleeping_agents(), 15), sleeping_agents()
        for pid, started in recorded:  # not one recorded process of theirs is left
            assert not alive(pid, started), pid
        assert status["sandboxes"]["reaped_at_start"]["sandboxes"] == len(ours)
        left = {p.stem for p in (state / "sandboxes").glob("*.json")}
        assert left == set(other_ids)  # only the live owner's record remains
        other_folder = other_record["folders"][0]
        folders = {str(p) for p in boxes.glob("rollserve-*") if p.name != "rollserve-python-0"}
        assert folders == {other_folder}  # no folder of the killed server's is left

        # The other server's sandbox was not touched: its processes still run.
        assert other_record["processes"]
        for process in other_record["processes"]:
            assert alive(process["pid"], process["started"])
        assert other.poll() is None
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=10)
        reap(state)  # the stand-in's sandbox, as its next server would

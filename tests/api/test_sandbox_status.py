"""The server's sandbox runtime as /v1/status shows it, and the reaper at start-up."""

from __future__ import annotations

import subprocess

import psutil

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.owner import OwnerRecord, ProcessRef


def dead_process() -> ProcessRef:
    child = subprocess.Popen(["sleep", "0"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    return ProcessRef(pid=child.pid, started=started)


async def test_start_up_reaps_a_dead_servers_sandboxes_and_says_so(make_api, tmp_path):
    state = tmp_path / "state0"  # where make_api puts its first service's state
    leftover = tmp_path / "rollserve-bubb-dead" / "workspace"
    leftover.mkdir(parents=True)
    (state / "sandboxes").mkdir(parents=True)
    record = OwnerRecord(
        sandbox_id="bubb-dead", runtime="bubblewrap", owner=dead_process(), folders=[str(leftover.parent)]
    )
    (state / "sandboxes" / "bubb-dead.json").write_text(record.model_dump_json())

    service, client = await make_api()
    status = (await client.get("/v1/status")).json()["sandboxes"]
    assert status["reaped_at_start"] == {"sandboxes": 1, "processes_killed": 0, "kept_live_owners": 0, "errors": []}
    assert not leftover.parent.exists() and not (state / "sandboxes" / "bubb-dead.json").exists()
    # The runtime is made at start (where it can run): nothing open yet, and the
    # limits in force are reported before any sandbox started.
    assert status["runtime"] == "bubblewrap" and status["open"] == 0 and status["started"] == 0
    reason = BubblewrapRuntime.unavailable_reason()
    if reason is None:
        assert status["ready"] is True and status["error"] is None
        limits = status["limits"]
        assert limits["defaults"]["disk_mb"] > 0 and limits["defaults"]["memory_mb"] > 0
        assert {"memory_mb", "disk_mb", "tmpfs_mb", "pids"} <= set(limits["enforced_by"])
    else:  # reported at once, and the server serves what needs no sandbox
        assert status["ready"] is False and reason in status["error"]

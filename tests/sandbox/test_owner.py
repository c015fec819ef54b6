"""Owner records and the reaper: a dead server's sandboxes go, a live one's stay; each
dead sandbox is reaped by the runtime named in its record (run on every runtime in the
registry, each that cannot run here skipped with its reason)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rollserve.sandbox.owner import OwnerBook, ProcessRef, is_alive, process_ref
from rollserve.sandbox.reaper import reap
from tests.sandbox.helpers import RUNTIMES, TEST_OPTIONS, cannot_run, wait_until

REPO = Path(__file__).resolve().parents[2]


def start_owner(state_dir: Path, runtime: str, count: int) -> tuple[subprocess.Popen, dict]:
    options = json.dumps(TEST_OPTIONS.get(runtime, {}))
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.sandbox.owner_process", str(state_dir), runtime, str(count), options],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = owner.stdout.readline()  # bounded by the test timeout
    assert line, f"owner process died: {owner.wait()}"
    return owner, json.loads(line)


def sandbox_processes(folders: list[str]) -> list[psutil.Process]:
    """Every host process that points into those sandboxes' folders (cwd, cmdline)."""
    found = []
    for process in psutil.process_iter():
        try:
            cwd = process.cwd()
            cmdline = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if any(cwd.startswith(f) or f in cmdline for f in folders):
            found.append(process)
    return found


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigkilled_server_leaves_nothing_and_a_live_servers_sandbox_stays(tmp_path, runtime):
    """50 sandboxes of a SIGKILLed owner: after reap, none of their processes remain;
    the sandbox of another, live owner in the same state dir is untouched.

    bubblewrap's --die-with-parent already ends its sandboxes when the owner dies; the
    local runtime's processes outlive their owner, so there the reaper does the work."""
    if reason := cannot_run(runtime):
        pytest.skip(reason)
    state = tmp_path / "state"
    dead, dead_info = start_owner(state, runtime, 50)
    live, live_info = start_owner(state, runtime, 1)
    try:
        records = {p.stem: json.loads(p.read_text()) for p in (state / "sandboxes").glob("*.json")}
        assert set(records) == set(dead_info["ids"]) | set(live_info["ids"])
        dead_refs = [ProcessRef(**ref) for i in dead_info["ids"] for ref in records[i]["processes"]]
        live_refs = [ProcessRef(**ref) for i in live_info["ids"] for ref in records[i]["processes"]]
        assert len(dead_refs) >= 50 and all(is_alive(ref) for ref in dead_refs + live_refs)
        dead_tree = psutil.Process(dead.pid).children(recursive=True)
        assert len(dead_tree) >= 50

        dead.send_signal(signal.SIGKILL)
        dead.wait()
        report = reap(state)  # what a restarted server does first

        assert sorted(report.reaped) == sorted(dead_info["ids"])
        assert report.kept == live_info["ids"]
        wait_until(
            lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in dead_tree),
            5,
            "the processes of the dead owner's sandboxes to end",
            interval=0.05,
        )
        assert not any(is_alive(ref) for ref in dead_refs)
        assert not sandbox_processes(dead_info["folders"])
        assert not any(Path(f).exists() for f in dead_info["folders"])
        assert sorted(p.stem for p in (state / "sandboxes").glob("*.json")) == live_info["ids"]

        # The live owner's sandbox: still there, still running.
        assert all(is_alive(ref) for ref in live_refs)
        assert sandbox_processes(live_info["folders"])
        assert reap(state).kept == live_info["ids"]
    finally:
        for owner in (dead, live):
            owner.kill()
            owner.wait()
    reap(state)
    assert not list((state / "sandboxes").glob("*.json"))
    assert not sandbox_processes(live_info["folders"])


def test_reaper_checks_start_times_not_just_pids(tmp_path):
    """A recorded pid that now belongs to another process (same pid, another start
    time) is never killed; a record whose owner pid was reused counts as dead."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        book = OwnerBook(tmp_path)
        entry = book.open("sbx-1", "local", [tmp_path / "gone"])
        ref = process_ref(bystander.pid)
        entry.record.owner = ProcessRef(pid=os.getpid(), started=1.0)  # "our pid, reused"
        entry._refs[bystander.pid] = ProcessRef(pid=bystander.pid, started=ref.started - 100)
        entry.save()
        report = reap(tmp_path)
        assert report.reaped == ["sbx-1"] and report.killed == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_is_identified_by_its_boot_relative_start_not_the_wall_clock():
    """A wall-clock step moves psutil's epoch start time (boot time + ticks) by whole
    seconds; the live process must still be recognised — CI once reaped a live
    server's own sandbox after the clock moved mid-run. Another start tick or another
    boot is another process."""
    ref = process_ref(os.getpid())
    assert ref is not None and ref.since_boot is not None and ref.boot_id
    assert is_alive(ref)
    assert is_alive(ref.model_copy(update={"started": ref.started + 1.0}))  # clock stepped
    assert not is_alive(ref.model_copy(update={"since_boot": ref.since_boot + 0.01}))
    assert not is_alive(ref.model_copy(update={"boot_id": "another-boot"}))
    # a record written before boot-relative times: epoch, within a clock step
    old = ProcessRef(pid=ref.pid, started=ref.started)
    assert is_alive(old) and not is_alive(old.model_copy(update={"started": ref.started - 100}))


def test_live_owner_records_are_untouched_and_closed_sandboxes_leave_none(tmp_path):
    book = OwnerBook(tmp_path)
    entry = book.open("sbx-2", "local", [tmp_path])
    assert reap(tmp_path).kept == ["sbx-2"]
    entry.delete()
    assert not list((tmp_path / "sandboxes").iterdir())


FAKE_ENGINE = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
"""


def dead_owner_record(book: OwnerBook, sandbox_id: str, runtime: str, folder: Path, **extra):
    entry = book.open(sandbox_id, runtime, [folder], **extra)
    entry.record.owner = ProcessRef(pid=os.getpid(), started=1.0)  # "our pid, reused": dead
    entry.save()
    return entry


def test_the_reaper_asks_the_runtime_named_in_the_record(tmp_path, monkeypatch):
    """A dead podman sandbox: its container is removed by the podman runtime, with the
    arguments that made it; its folder goes with it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(FAKE_ENGINE)
    (bin_dir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    folder = tmp_path / "box"
    (folder / "workspace").mkdir(parents=True)
    dead_owner_record(
        OwnerBook(tmp_path / "state"),
        "podm-1",
        "podman",
        folder,
        container="rollserve-podm-1",
        engine="podman",
        engine_args=["--runtime", "runc"],
    )
    report = reap(tmp_path / "state")
    assert report.reaped == ["podm-1"] and report.errors == []
    assert (bin_dir / "calls.log").read_text().splitlines() == ["--runtime runc rm -f rollserve-podm-1"]
    assert not folder.exists()


def test_a_record_of_an_unknown_runtime_still_loses_its_processes_and_folders(tmp_path):
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        folder = tmp_path / "box"
        folder.mkdir()
        entry = dead_owner_record(OwnerBook(tmp_path / "state"), "fire-1", "firecracker", folder)
        entry.add(victim.pid)
        report = reap(tmp_path / "state")
        assert report.reaped == ["fire-1"] and report.killed == [victim.pid]
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert not folder.exists()
        (error,) = report.errors
        assert "unknown runtime 'firecracker'" in error and "fire-1" in error
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("runtime", ["bubblewrap", "local"])
def test_the_record_is_written_before_the_folder_and_a_failed_start_leaves_neither(tmp_path, runtime, monkeypatch):
    """A server killed while a sandbox is being made leaves a record its next server
    reaps, never an unowned folder: the owner record names the folder before it exists
    (and the reaper takes a folder that was never made); a start that fails after the
    folder was made removes it and its record."""
    import asyncio

    from rollserve.sandbox.base import SandboxError, SandboxSpec
    from rollserve.sandbox.config import runtime_config
    from rollserve.sandbox.folders import SandboxFolders
    from rollserve.sandbox.registry import get_runtime

    if reason := cannot_run(runtime):
        pytest.skip(reason)
    state, boxes = tmp_path / "state", tmp_path / "boxes"
    rt = get_runtime(
        runtime,
        state,
        runtime_config(
            runtime,
            {
                **TEST_OPTIONS.get(runtime, {}),
                "root": str(boxes),
                **({"share_interpreter": False} if runtime == "bubblewrap" else {}),
            },
        ),
    )
    seen: list[list[str]] = []
    made: list[Path] = []
    create = SandboxFolders.create

    def create_then_fail(cls, root, sandbox_id, *args):
        records = [json.loads(p.read_text()) for p in (state / "sandboxes").glob("*.json")]
        seen.append([f for r in records for f in r["folders"]])
        folders = create(root, sandbox_id, *args)
        made.append(folders.base)
        raise OSError("disk full (the test's)")

    monkeypatch.setattr(SandboxFolders, "create", classmethod(create_then_fail))
    with pytest.raises(SandboxError, match="disk full"):
        asyncio.run(rt.start(SandboxSpec()))
    assert len(made) == 1 and seen == [[str(made[0])]]  # recorded before it existed
    assert not made[0].exists()  # removed by the failed start
    assert not list((state / "sandboxes").glob("*.json"))  # and its record with it
    # A record whose folder was never made (the kill came between them) reaps cleanly.
    book = OwnerBook(state)
    entry = book.open("bubb-never-made", runtime, [boxes / "rollserve-bubb-never-made"])
    entry.record.owner = ProcessRef(pid=2**22 + 1, started=0.0)  # a dead owner
    entry.save()
    report = reap(state)
    assert report.reaped == ["bubb-never-made"] and not report.errors, report
    assert not list((state / "sandboxes").glob("*.json"))

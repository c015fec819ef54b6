"""Resource caps per sandbox, tried the way a runaway or cheating agent would: write
past the in-memory filesystems, fill the workspace and /tmp, hide a growing file by
deleting it while it is open. Real sandboxes, caps of a few MB."""

from __future__ import annotations

import asyncio
import os

import pytest

from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.diskcap import MB, folder_usage
from tests.sandbox.helpers import (NESTED, RUNTIMES, make_runtime, our_descendants,
                                   rerun_unprivileged, wait_until)

needs_bwrap = pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None,
                                 reason=f"{BubblewrapRuntime.unavailable_reason()}")

# One 1 MB file every 50 ms, 300 of them (15 s): unstopped it ends with "finished".
FILL = ("for i in $(seq 300); do head -c 1048576 /dev/zero > {folder}/fill-$i || exit 3; "
        "sleep 0.05; done; echo fin''ished")  # (a PTY echoes the line: not "finished")


@pytest.fixture(params=RUNTIMES)
def runtime(request, tmp_path):
    return make_runtime(request.param, tmp_path / "state")


def disk_limits(disk_mb: int = 8) -> SandboxLimits:
    return SandboxLimits(disk_mb=disk_mb, memory_mb=512, pids=64)


def assert_stopped_by_the_disk_cap(result, box) -> None:
    assert result.cap == "disk" and result.signal == 9 and not result.ok, result
    assert "finished" not in result.stdout
    assert "disk cap" in result.stderr and "Delete files to go on" in result.stderr
    assert "disk cap" in result.failure()  # what a handler's error message shows


@needs_bwrap
async def test_in_memory_filesystems_are_capped_or_read_only(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    spec = SandboxSpec(limits=SandboxLimits(tmpfs_mb=4, memory_mb=512, pids=64))
    async with await runtime.start(spec) as box:
        shm = await box.exec("head -c 6000000 /dev/zero > /dev/shm/big; echo rc=$?; "
                             "stat -c %s /dev/shm/big; rm /dev/shm/big; "
                             "python3 -c 'import multiprocessing as m; m.Lock(); print(\"lock\")'", 20)
        assert "No space left on device" in shm.stderr
        rc, size, lock = shm.stdout.split()
        assert rc == "rc=1" and int(size) <= 4 * MB and lock == "lock"  # still usable
        # bwrap's own tmpfs at / and /dev belong to the sandbox's user: read-only now.
        for path in ("/x", "/dev/x", "/newfolder/x"):
            result = await box.exec(f"mkdir -p $(dirname {path}) && head -c 1000 /dev/zero > {path}", 10)
            assert not result.ok and "Read-only file system" in result.stderr, (path, result)
        assert (await box.exec("echo ok > /dev/null && echo ok", 10)).stdout == "ok\n"


@needs_bwrap
async def test_an_old_bwrap_puts_dev_shm_under_the_disk_cap(tmp_path, monkeypatch):
    """bwrap before 0.7 (RHEL 9 ships 0.4) cannot size a tmpfs: /dev/shm is then a
    folder of the sandbox's, which the disk cap counts."""
    from rollserve.sandbox import bwrap_view

    monkeypatch.setattr(bwrap_view, "bwrap_options", lambda binary: frozenset())  # no --size
    runtime = BubblewrapRuntime(tmp_path / "state")
    assert not runtime.sized_tmpfs and "under the disk cap" in runtime.caps()["tmpfs_mb"]
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        result = await box.exec(FILL.format(folder="/dev/shm"), 120)
        assert_stopped_by_the_disk_cap(result, box)
        assert list((box.folders.base / "shm").glob("fill-*"))
        assert "Read-only file system" in (await box.exec("touch /dev/x", 10)).stderr


async def test_filling_the_workspace_past_the_cap_is_stopped(runtime):
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        result = await box.exec(FILL.format(folder="."), 120)
        assert_stopped_by_the_disk_cap(result, box)
        written = len(list(box.workspace.glob("fill-*")))
        assert 8 <= written < 300
        # Nothing of it runs on; the sandbox stays open: deleting gets it under the cap.
        assert wait_until(lambda: not [p for p in our_descendants() if p.name() == "sleep"])
        cleaned = await box.exec("rm -f fill-*; head -c 100000 /dev/zero > small && echo ok", 30)
        assert cleaned.stdout == "ok\n" and cleaned.cap is None
        assert box.disk.used is not None


async def test_tmp_counts_against_the_disk_cap(runtime):
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        result = await box.exec(FILL.format(folder='"${TMPDIR:-/tmp}"'), 120)
        assert_stopped_by_the_disk_cap(result, box)


async def test_a_deleted_file_held_open_still_counts(runtime):
    hide = ("exec 3> hidden; rm hidden; for i in $(seq 300); do "
            "head -c 1048576 /dev/zero >&3 || exit 3; sleep 0.05; done; echo fin''ished")
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        result = await box.exec(hide, 120)
        assert_stopped_by_the_disk_cap(result, box)


async def test_above_the_cap_only_growth_is_stopped(runtime):
    """Files the cap left behind do not kill every later command: only a command
    that makes the sandbox grow further is stopped (so the agent can clean up)."""
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        first = await box.exec(FILL.format(folder="."), 120)
        assert first.cap == "disk"
        await box.disk.check()  # the usage it was stopped at, measured again: no growth
        assert (await box.exec("ls fill-* | wc -l", 30)).cap is None
        again = await box.exec("for i in $(seq 300); do head -c 1048576 /dev/zero > more-$i; "
                               "sleep 0.05; done; echo fin''ished", 120)
        assert again.cap == "disk" and "finished" not in again.stdout


async def test_a_shell_killed_by_the_cap_says_why(runtime):
    async with await runtime.start(SandboxSpec(limits=disk_limits())) as box:
        shell = await box.spawn(["bash", "--norc", "--noprofile", "-i"], pty=True)
        await shell.write((FILL.format(folder=".") + "\n").encode())
        output = b""
        async with asyncio.timeout(60):  # unstopped, the loop ends in 15 s, then the shell waits
            while chunk := await shell.read():
                output += chunk
        assert shell.cap == "disk"
        assert b"reached its disk cap" in output and b"finished\r\n" not in output


def test_usage_counts_blocks_once_and_opens_closed_folders(tmp_path):
    data = tmp_path / "data"
    data.write_bytes(b"x" * (2 * MB))
    os.link(data, tmp_path / "same-data")  # a hard link: the same blocks
    with open(tmp_path / "sparse", "wb") as sparse:
        sparse.truncate(100 * MB)  # a hole: no blocks
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "inside").write_bytes(b"y" * MB)
    closed.chmod(0)
    try:
        used = folder_usage(tmp_path)
    finally:
        closed.chmod(0o700)
    assert 3 * MB <= used < 3 * MB + 256 * 1024  # data once, inside; not the hole


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: this run is that case")
@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="nested run")
def test_caps_as_an_unprivileged_user(tmp_path):
    rerun_unprivileged(__file__, tmp_path)

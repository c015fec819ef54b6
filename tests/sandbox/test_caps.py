"""Resource caps per sandbox, tried the way a runaway or cheating agent would: write
past the in-memory filesystems, fill the workspace and /tmp, hide a growing file by
deleting it while it is open, hold memory where RLIMIT_AS does not see it (System V
shared memory detached, memfd files). Real sandboxes, caps of a few MB."""

from __future__ import annotations

import asyncio
import os

import pytest

from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.diskcap import MB, folder_usage
from tests.sandbox.helpers import (
    NESTED,
    RUNTIMES,
    make_runtime,
    our_descendants,
    rerun_unprivileged,
    wait_until,
)

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)

# One 1 MB file every 50 ms, 300 of them (15 s): unstopped it ends with "finished".
FILL = (
    "for i in $(seq 300); do head -c 1048576 /dev/zero > {folder}/fill-$i || exit 3; "
    "sleep 0.05; done; echo fin''ished"
)  # (a PTY echoes the line: not "finished")


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
        shm = await box.exec(
            "head -c 6000000 /dev/zero > /dev/shm/big; echo rc=$?; "
            "stat -c %s /dev/shm/big; rm /dev/shm/big; "
            "python3 -c 'import multiprocessing as m; m.Lock(); print(\"lock\")'",
            20,
        )
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
    hide = (
        "exec 3> hidden; rm hidden; for i in $(seq 300); do "
        "head -c 1048576 /dev/zero >&3 || exit 3; sleep 0.05; done; echo fin''ished"
    )
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
        again = await box.exec(
            "for i in $(seq 300); do head -c 1048576 /dev/zero > more-$i; sleep 0.05; done; echo fin''ished", 120
        )
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


# System V shared memory: 32 MB segments, each filled, then detached (it lives on in
# the IPC namespace unless the namespace destroys unattached segments), 40 of them.
SYSV_HOG = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for i in range(40):
    sid = libc.shmget(0, 32 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if sid < 0:
        print("refused", ctypes.get_errno())
        break
    addr = libc.shmat(sid, None, 0)
    if addr == ctypes.c_void_p(-1).value:
        print("refused", ctypes.get_errno())
        break
    ctypes.memset(addr, 1, 32 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    made += 1
rows = open("/proc/sysvipc/shm").read().splitlines()[1:]
print("made", made, "held_mb", sum(int(r.split()[3]) for r in rows) >> 20)
"""
# The same segments kept attached, one in each of 8 processes (each well under its
# RLIMIT_AS): 256 MB held together unless the namespace's shmall refuses them.
SYSV_SPREAD_HOG = r"""
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
children = []
for i in range(8):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        sid = libc.shmget(0, 32 << 20, 0o1600)
        if sid < 0:
            os.write(w, b"refused %d" % ctypes.get_errno())
            os._exit(0)
        ctypes.memset(libc.shmat(sid, None, 0), 1, 32 << 20)
        os.write(w, b"attached")
        time.sleep(60)
        os._exit(0)
    children.append(pid)
    print(os.read(r, 100).decode())
rows = open("/proc/sysvipc/shm").read().splitlines()[1:]
print("held_mb", sum(int(r.split()[3]) for r in rows) >> 20)
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""
# memfd files: 16 MB each, every 50 ms, kept open; 40 of them (640 MB) in 2 s.
MEMFD_HOG = r"""
import os, time
fds = []
for i in range(40):
    fd = os.memfd_create(f"hog{i}")
    os.write(fd, b"x" * (16 << 20))
    fds.append(fd)
    time.sleep(0.05)
time.sleep(10)
print("fin" "ished")
"""
# The same memory behind 4 KB mappings of memfd files whose descriptors are closed.
MEMFD_MAPPED_HOG = MEMFD_HOG.replace(
    "    fds.append(fd)",
    """    import mmap
    fds.append(mmap.mmap(fd, 4096))
    os.close(fd)""",
)


def memory_limits() -> SandboxLimits:
    return SandboxLimits(memory_mb=128, pids=64)


@needs_bwrap
async def test_system_v_shared_memory_is_capped_or_reported(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    why = runtime.ipc_unavailable_reason
    if why is not None:  # a server that is not root: /v1/status says so
        assert f"System V shared memory: NOT capped ({why})" in runtime.caps()["memory_mb"]
        return
    assert "System V shared memory: at most memory_mb" in runtime.caps()["memory_mb"]
    async with await runtime.start(SandboxSpec(limits=memory_limits())) as box:
        result = await box.exec(["python3", "-c", SYSV_HOG], 60)
        assert result.ok, result
        # Each segment went when it was detached: nothing is held past a mapping.
        assert result.stdout.split()[-4:] == ["made", "40", "held_mb", "0"], result.stdout
        # Kept attached across processes, together they are refused at the cap.
        kept = await box.exec(["python3", "-c", SYSV_SPREAD_HOG], 60)
        lines = kept.stdout.split("\n")
        assert lines[:5] == ["attached"] * 4 + ["refused 28"], kept  # ENOSPC
        assert lines[-2] == "held_mb 128", kept
        # The caps are the namespace's, and the sandbox cannot raise them.
        raised = await box.exec("echo 0 > /proc/sys/kernel/shm_rmid_forced", 10)
        assert "Read-only file system" in raised.stderr, raised


@needs_bwrap
@pytest.mark.parametrize("hog", [MEMFD_HOG, MEMFD_MAPPED_HOG], ids=["open", "mapped"])
async def test_memfd_files_count_against_the_memory_cap(tmp_path, hog):
    runtime = BubblewrapRuntime(tmp_path / "state")
    if runtime.cgroup_parent is not None:
        pytest.skip("a cgroup bounds this sandbox's memory, memfd files included")
    assert "memfd files" in runtime.caps()["memory_mb"]
    if hog is MEMFD_MAPPED_HOG and os.geteuid() != 0:  # not caught: /v1/status says so
        assert "may not read /proc/PID/map_files" in runtime.caps()["memory_mb"]
        return
    async with await runtime.start(SandboxSpec(limits=memory_limits())) as box:
        result = await box.exec(["python3", "-c", hog], 60)
        assert result.cap == "memory" and not result.ok, result
        assert "finished" not in result.stdout and "reached its memory cap" in result.stderr
        assert 128 * MB < box.memfd.used < 400 * MB  # stopped near the cap, not at 640 MB
        assert (await box.exec("echo still usable", 10)).stdout == "still usable\n"


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: this run is that case")
@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="nested run")
def test_caps_as_an_unprivileged_user(tmp_path):
    rerun_unprivileged(__file__, tmp_path)

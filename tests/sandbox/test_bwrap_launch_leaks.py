"""A bwrap launch cut short leaves no process behind (the leak seen once after a Ray
cluster run: a `bwrap ... -- setsid --ctty --wait bash -i` with PPID 1 and no
children, its sandbox's folder and owner record gone).

bwrap's first process waits on ``--block-fd`` *before* it sets its own parent-death
signal: killed alone, bwrap leaves it blocked, PPID 1, until the fd's write end
closes (then it runs the command, unlimited). So a launch cancelled mid-way is killed
before the block fd closes, and closing a sandbox kills each launch's first process
itself, at bwrap's exit and at the close, not only through bwrap's process group
(which it leaves at --new-session)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollserve.sandbox import bubblewrap
from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime, BubblewrapSandbox
from tests.sandbox.helpers import processes_with
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="no bwrap")

SHELL = ["bash", "-i"]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def gone(pids: list[int], timeout: float = 10.0) -> bool:
    return await eventually(
        lambda: not any(running(p) for p in pids), timeout, f"processes {pids} to be gone", interval=0.05
    )


def descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


async def test_a_launch_cancelled_mid_way_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    runtime = BubblewrapRuntime(tmp_path / "state")
    box = await runtime.start(SandboxSpec())
    read_all = bubblewrap._read_all
    launched: list[int] = []
    stuck = asyncio.Event()

    async def slow_read(fd: int) -> bytes:  # bwrap answered; the launch is cut here
        info = await read_all(fd)
        launched.extend(p.pid for p in box._processes)
        stuck.set()
        await asyncio.sleep(60)
        return info

    monkeypatch.setattr(bubblewrap, "_read_all", slow_read)
    spawning = asyncio.create_task(box.spawn(SHELL, pty=True))
    await asyncio.wait_for(stuck.wait(), 30)
    pids = [pid for p in launched for pid in (p, *descendants(p))]
    assert len(pids) >= 2  # bwrap and its first process, blocked
    spawning.cancel()
    await asyncio.gather(spawning, return_exceptions=True)
    # Not by the sandbox's close: the cancelled launch itself ends them.
    assert await gone(pids), [psutil.Process(p).cmdline() for p in pids if running(p)]
    await box.close()


async def test_closing_a_sandbox_whose_bwrap_died_alone_kills_its_first_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """bwrap killed by itself (its parent-death signal, say) while its first process
    waits on the block fd: that one would live on (PPID 1) and run the command once the
    launch lets it go; bwrap's exit ends it, and the sandbox closes clean."""
    runtime = BubblewrapRuntime(tmp_path / "state")
    box = await runtime.start(SandboxSpec())
    record = BubblewrapSandbox._record
    first: list[int] = []

    def record_then_lose_bwrap(self: BubblewrapSandbox, process: Any, *pids: int) -> None:
        record(self, process, *pids)
        first.extend(pids)
        os.kill(process.pid, signal.SIGKILL)  # bwrap alone, not its group

    monkeypatch.setattr(BubblewrapSandbox, "_record", record_then_lose_bwrap)
    try:
        await box.spawn(SHELL, pty=True)
    except Exception:
        pass  # bwrap is gone: the launch may or may not see it
    (init,) = first
    tree = [init, *descendants(init)]
    assert await gone(tree), [psutil.Process(p).cmdline() for p in tree if running(p)]
    await asyncio.wait_for(box.close(), 30)
    assert list((tmp_path / "state" / "sandboxes").glob("*.json")) == []


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_cancelled_launches_leave_no_open_pipes(tmp_path, monkeypatch):
    """A launch cancelled after bwrap reported its child: its pipes are closed too (once
    it exits the sandbox no longer tracks it, so its close would never reach them)."""
    box = await BubblewrapRuntime(tmp_path / "state").start(SandboxSpec())
    read_all = bubblewrap._read_all
    stuck = asyncio.Event()

    async def slow_read(fd: int) -> bytes:
        info = await read_all(fd)
        stuck.set()
        await asyncio.sleep(60)
        return info

    monkeypatch.setattr(bubblewrap, "_read_all", slow_read)
    before = open_fds()
    for _ in range(5):
        stuck.clear()
        task = asyncio.create_task(box.spawn(["bash", "-c", "sleep 100"], pty=False, merge_stderr=False))
        await asyncio.wait_for(stuck.wait(), 30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await box.close()
    assert open_fds() == before


async def test_a_cancel_while_a_failed_launch_is_reported_never_starts_the_command(tmp_path, monkeypatch):
    """The launch fails in the block-fd window (its record, say) and is cancelled while
    its failure is read: the command never runs (the fd's EOF would start it)."""
    box = await BubblewrapRuntime(tmp_path / "state").start(SandboxSpec())

    def failing_record(self: BubblewrapSandbox, process: Any, *pids: int) -> None:
        raise OSError("a failure in the block-fd window")

    failure_output = bubblewrap._failure_output
    reading = asyncio.Event()

    async def read_failure(process: Any) -> str:
        reading.set()
        return await failure_output(process)

    monkeypatch.setattr(BubblewrapSandbox, "_record", failing_record)
    monkeypatch.setattr(bubblewrap, "_failure_output", read_failure)
    task = asyncio.create_task(box.spawn(["bash", "-c", "echo ran > ran; sleep 30"], pty=False))
    await asyncio.wait_for(reading.wait(), 30)
    task.cancel()  # inside the failure's output read
    await asyncio.gather(task, return_exceptions=True)
    # Once no process of the launch is left, the command can no longer run.
    await eventually(lambda: not processes_with("echo ran > ran"), what="the launch's processes to end")
    ran = list(Path(box.folders.base).rglob("ran"))
    await box.close()
    assert ran == []

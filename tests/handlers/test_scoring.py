"""ScoringPool: timeouts kill and replace workers, cancellation stops a task, close
leaves no worker behind, and the event loop never waits on a worker."""

from __future__ import annotations

import asyncio
import operator
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rollserve.errors import AgentError, InfraError
from rollserve.handlers.scoring import ScoringPool, ScoringTimeout, ScoringUnavailable
from tests.waiting import eventually, wait_until


async def _wait_gone(pid: int, within: float = 5.0) -> bool:
    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return await eventually(gone, within, f"process {pid} to be gone", interval=0.05)


def _mark_then_sleep(marker: str, seconds: float) -> None:
    """A scoring function that says when a worker has picked it up, then hangs."""
    Path(marker).touch()
    time.sleep(seconds)  # sleep-ok: the hanging task under test


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_mp_infrastructure(proc: psutil.Process) -> bool:
    """multiprocessing's per-process singletons (fork server, resource tracker): they
    are direct children, shared by everything, and exit when this process exits."""
    try:
        cmdline = " ".join(proc.cmdline())
        return proc.ppid() == os.getpid() and (
            "multiprocessing.forkserver import main" in cmdline
            or "multiprocessing.resource_tracker import main" in cmdline
        )
    except psutil.NoSuchProcess:
        return True


def _stray_processes(before: set[int]) -> list[psutil.Process]:
    live = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in before or _is_mp_infrastructure(proc):
            continue
        if _is_alive(proc):
            live.append(proc)
    return live


async def test_scores_in_another_process():
    async with ScoringPool(workers=1, default_timeout=5) as pool:
        assert await pool.score(operator.add, 2, 3) == 5
        assert await pool.score(os.getpid) != os.getpid()


async def test_timeout_kills_the_worker_and_the_pool_keeps_working():
    async with ScoringPool(workers=1, default_timeout=5) as pool:
        first_worker = await pool.score(os.getpid)
        started = time.monotonic()
        with pytest.raises(ScoringTimeout) as info:
            await pool.score(time.sleep, 3600, timeout=0.5)
        assert time.monotonic() - started < 10  # bounded: not the hour
        # A pathological answer is the agent's fault; it is also a TimeoutError.
        assert isinstance(info.value, AgentError)
        assert isinstance(info.value, asyncio.TimeoutError)
        assert await _wait_gone(first_worker)
        assert await pool.score(operator.mul, 6, 7) == 42
        assert await pool.score(os.getpid) != first_worker


async def test_cancelling_the_caller_stops_the_running_task(tmp_path):
    async with ScoringPool(workers=1, default_timeout=60) as pool:
        worker = await pool.score(os.getpid)
        marker = tmp_path / "picked"
        task = asyncio.create_task(pool.score(_mark_then_sleep, str(marker), 3600))
        await eventually(marker.exists, what="a worker to pick the task up")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _wait_gone(worker), "the worker running the cancelled task is still alive"
        assert await pool.score(operator.add, 1, 1) == 2


async def test_loop_keeps_ticking_while_a_task_hangs(loop_gaps):
    async with ScoringPool(workers=1, default_timeout=0.8) as pool:
        gaps = loop_gaps
        with pytest.raises(ScoringTimeout):
            await pool.score(time.sleep, 3600)
        assert len(gaps) > 20 and max(gaps) < 0.3


async def test_function_errors_are_reraised_as_is():
    async with ScoringPool(workers=1) as pool:
        with pytest.raises(ZeroDivisionError):
            await pool.score(operator.truediv, 1, 0)
        assert await pool.score(operator.add, 1, 2) == 3


@pytest.mark.parametrize("context", ["forkserver", "spawn"])
async def test_close_leaves_no_worker_process(context, tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    pool = ScoringPool(workers=2, default_timeout=30, context=context)
    await pool.astart()
    workers = {await pool.score(os.getpid) for _ in range(4)}
    assert workers and not workers & before
    marker = tmp_path / "picked"
    hanging = asyncio.create_task(pool.score(_mark_then_sleep, str(marker), 3600))
    await eventually(marker.exists, what="a worker to pick the task up")
    await pool.aclose()
    # The caller of a task the close interrupted is not left waiting.
    with pytest.raises(ScoringUnavailable):
        await asyncio.wait_for(hanging, 5)
    for pid in workers:
        assert await _wait_gone(pid)
    assert _stray_processes(before) == []


async def test_closed_pool_is_an_infra_error():
    pool = ScoringPool(workers=1)
    pool.close()
    with pytest.raises(ScoringUnavailable) as info:
        await pool.score(operator.add, 1, 2)
    assert isinstance(info.value, InfraError)


def test_fork_is_refused():
    with pytest.raises(ValueError):
        ScoringPool(context="fork")


_SERVER_SCRIPT = """
import asyncio, sys, time
from rollserve.handlers.scoring import ScoringPool

async def main():
    pool = ScoringPool(workers=2, default_timeout=3600)
    await pool.astart()
    asyncio.create_task(pool.score(time.sleep, 3600))           # stuck in a syscall
    asyncio.create_task(pool.score(sum, range(10**13)))         # stuck in C code
    await asyncio.sleep(1.0)
    print("ready", flush=True)
    await asyncio.sleep(3600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_no_process_outlives_a_killed_server(tmp_path):
    """A SIGKILLed server leaves nothing behind: not the fork server, not a worker
    stuck in C code, not multiprocessing's resource tracker."""
    script = tmp_path / "server.py"
    script.write_text(_SERVER_SCRIPT)
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        descendants = psutil.Process(server.pid).children(recursive=True)
        assert len(descendants) >= 3  # fork server + 2 workers (+ resource tracker)
    finally:
        server.kill()
        server.wait()
    wait_until(
        lambda: not [p for p in descendants if _is_alive(p)],
        10,
        "the killed server's descendants to be gone",
        interval=0.1,
    )

"""The disk and memfd cap watchers on one shared ticker (sandbox/watch.py): one
host-wide reading per tick for every watcher, and none at all for a bubblewrap
sandbox that holds no process (a pooled one, or one between commands), while the caps
still stop a writer."""

from __future__ import annotations

import pytest

from rollserve.sandbox import diskcap, shmcap, watch
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.diskcap import DiskWatch
from tests.waiting import eventually

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)


async def nothing_exceeded(used: int) -> None:
    raise AssertionError(f"no cap was passed here ({used} bytes)")


def settled(w: watch.TickedWatch) -> bool:
    """Not poked and not reading: an idle sandbox's watcher ticks no more from now on."""
    return not w._poked and (w._checking is None or w._checking.done())


async def ticks_go_by(n: int = 3) -> None:
    """Wait (bounded) until the shared ticker has ticked ``n`` more times."""
    ticker = watch.ticker(diskcap.POLL)
    first = ticker.rounds
    await eventually(lambda: ticker.rounds >= first + n, timeout=30)


async def test_many_watchers_share_one_reading_per_tick(tmp_path, monkeypatch):
    reads: list[int] = []
    real = diskcap.filesystem_used

    def counted(folder):
        reads.append(1)
        return real(folder)

    monkeypatch.setattr(diskcap, "filesystem_used", counted)
    folders = [tmp_path / f"box{i}" for i in range(50)]
    watches = []
    for folder in folders:
        folder.mkdir()
        w = DiskWatch(folder, 100 << 20, list, nothing_exceeded)
        w.start()
        watches.append(w)
    try:
        ticker = watch.ticker(diskcap.POLL)
        await ticks_go_by(4)
        rounds = ticker.rounds
        assert all(w.ticks >= 3 for w in watches)  # every watcher ticked each round...
        assert len(reads) <= rounds  # ...on one reading of the filesystem per round, not 50
    finally:
        for w in watches:
            await w.stop()
    assert len(watch.ticker(diskcap.POLL)) == 0  # stopped watchers leave the ticker


async def test_a_watcher_whose_folder_is_gone_leaves_the_ticker(tmp_path):
    folder = tmp_path / "box"
    folder.mkdir()
    gone = DiskWatch(folder, 100 << 20, list, nothing_exceeded)
    gone.start()
    await ticks_go_by(2)
    folder.rmdir()  # the sandbox's folder removed under it: the watcher leaves the ticker
    ticker = watch.ticker(diskcap.POLL)
    await eventually(lambda: gone not in ticker._watches, timeout=30)
    await gone.stop()


@needs_bwrap
async def test_an_idle_bubblewrap_sandbox_is_not_polled(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    async with await runtime.start(SandboxSpec()) as box:
        watchers = [w for w in (box.disk, box.memfd) if w is not None]
        assert box.disk is not None and watchers
        await ticks_go_by(3)
        assert [w.ticks for w in watchers] == [0] * len(watchers)  # nothing runs in it: no reading
        shell = await box.spawn(["bash", "--norc", "--noprofile", "-i"], pty=True)
        await ticks_go_by(3)
        assert all(w.ticks >= 2 for w in watchers)  # a process lives in it: watched
        await shell.kill()
        await eventually(lambda: not box.root_pids(), timeout=30)
        await ticks_go_by(2)  # (the last process's end: one more reading)
        # A poke that came while a reading still ran is taken at a later tick: wait for
        # it to be taken and the reading to end before noting the count.
        await eventually(lambda: all(settled(w) for w in watchers), timeout=30, what="the watchers to settle")
        idle = [w.ticks for w in watchers]
        await ticks_go_by(3)
        assert [w.ticks for w in watchers] == idle


@needs_bwrap
async def test_the_disk_cap_stops_a_writer_between_idle_spells(tmp_path):
    """Idle, then a command that writes past the cap: stopped as before."""
    runtime = BubblewrapRuntime(tmp_path / "state")
    limits = SandboxLimits(disk_mb=8, memory_mb=512, pids=64)
    async with await runtime.start(SandboxSpec(limits=limits)) as box:
        await ticks_go_by(2)
        fill = (
            "for i in $(seq 300); do head -c 1048576 /dev/zero > fill-$i || exit 3; sleep 0.05; done; echo fin''ished"
        )
        result = await box.exec(fill, 120)
        assert result.cap == "disk" and "finished" not in result.stdout, result
        assert 8 <= len(list(box.workspace.glob("fill-*"))) < 300


async def test_the_old_way_still_runs_a_task_per_watcher(tmp_path, monkeypatch):
    """``SHARED_TICK`` off (the benchmark's old path): a watcher polls on its own."""
    monkeypatch.setattr(watch, "SHARED_TICK", False)
    w = shmcap.MemfdWatch(100 << 20, list, nothing_exceeded)
    w.start()
    try:
        assert w._task is not None and w._ticker is None
        await eventually(lambda: w._last_shmem is not None, timeout=30)
    finally:
        await w.stop()
    assert w._task is None

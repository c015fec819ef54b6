"""The warm pool's sizing and bounds (sandbox/pool.py): what can be pooled, the demand
window, refilling toward the demand within the capacity, trimming past it, each
sandbox handed out once, emptied at close; files written at acquisition (a real
local-runtime sandbox)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rollserve.sandbox import pool as pool_module
from rollserve.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.local import LocalRuntime
from rollserve.sandbox.pool import Demand, SandboxPool, pool_key, targets
from tests.waiting import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountedSandbox(Sandbox):
    """A sandbox that only counts: the pool's logic without a runtime under it."""

    made = 0

    def __init__(self, spec: SandboxSpec) -> None:
        CountedSandbox.made += 1
        self.id = f"fake-{CountedSandbox.made}"
        self.runtime = "fake"
        self.spec = spec
        self._closed = False

    async def exec(self, command, timeout, stdin=None, env=None, max_output=1 << 20, *, cpu_budget=None) -> ExecResult:
        raise AssertionError("nothing runs in a pooled sandbox before it is handed out")

    async def spawn(self, argv, pty=False, env=None, *, merge_stderr=True):
        raise AssertionError("nothing runs in a pooled sandbox before it is handed out")

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        return not self._closed and not getattr(self, "broken", False)

    async def close(self) -> None:
        self._closed = True


class Starter:
    def __init__(self, fail: bool = False) -> None:
        self.made: list[CountedSandbox] = []
        self.fail = fail

    async def __call__(self, spec: SandboxSpec) -> Sandbox:
        if self.fail:
            raise SandboxError("no bwrap here")
        sandbox = CountedSandbox(spec)
        self.made.append(sandbox)
        return sandbox


def test_the_key_leaves_out_only_what_is_written_after_start():
    base = SandboxSpec(env={"A": "1"})
    assert pool_key(base) == pool_key(base.model_copy(update={"files": {"x.py": "1"}, "start_timeout": 5.0}))
    for change in (
        {"env": {"A": "2"}},
        {"network": True},
        {"image": "/rootfs"},
        {"limits": SandboxLimits(memory_mb=512)},
        {"hide": ["/data"]},
        {"folders": ["/tests"]},
        {"workspace_aliases": ["/testbed"]},
    ):
        assert pool_key(base.model_copy(update=change)) != pool_key(base), change
    seeded = SandboxSpec(workspace_seed="/testbed")
    assert pool_key(seeded) is not None  # a seed alone: the same at start
    # A seed with files: a cold start writes the files before the seed covers them.
    assert pool_key(seeded.model_copy(update={"files": {"a": "b"}})) is None


def test_demand_counts_the_window_and_is_bounded():
    demand = Demand(window=10.0, limit=3)
    for t in (0.0, 1.0, 2.0):
        demand.record(t)
    assert demand.count(5.0) == 3
    assert demand.count(10.5) == 2  # the acquisition at 0 left the window
    assert demand.count(100.0) == 0
    for t in range(100):
        demand.record(200.0 + t / 100)
    assert demand.count(201.0) == 3  # never more remembered than the pool could hold


def test_targets_serve_the_most_wanted_first_within_the_capacity():
    assert targets({"a": 5, "b": 3}, 6) == {"a": 5, "b": 1}
    assert targets({"a": 2, "b": 3}, 10) == {"a": 2, "b": 3}
    assert targets({"a": 5}, 0) == {"a": 0}
    assert targets({"a": 1, "b": 2}, 8) == {"a": 0, "b": 2}  # asked for once: not pooled


async def test_refills_toward_the_demand_and_hands_each_out_once():
    clock, start = Clock(), Starter()
    pool = SandboxPool(start, capacity=8, clock=clock)
    spec = SandboxSpec()
    assert [await pool.acquire(spec) for _ in range(3)] == [None] * 3  # cold: misses
    await eventually(lambda: len(pool.ready()) == 3, what="3 ready (the demand)")
    handed = [await pool.acquire(spec) for _ in range(3)]
    assert all(s is not None for s in handed) and len({id(s) for s in handed}) == 3
    assert pool.hits == 3 and pool.misses == 3
    assert not any(s in pool.ready() for s in handed)  # never taken back
    await eventually(lambda: len(pool.ready()) == 6, what="refilled to the new demand")
    assert not any(s in pool.ready() for s in handed)
    await pool.aclose()


async def test_never_holds_more_than_its_capacity_over_all_keys():
    clock, start = Clock(), Starter()
    pool = SandboxPool(start, capacity=5, clock=clock)
    small = SandboxSpec(limits=SandboxLimits(memory_mb=256))
    for _ in range(20):
        assert await pool.acquire(SandboxSpec()) is None
    for _ in range(4):
        await pool.acquire(small)
    await eventually(lambda: pool.held() == 5, what="filled to the capacity")
    await pool.step()
    assert pool.held() == 5 and len(start.made) == 5
    # The most wanted key first: all 5 of the default spec, none of the other.
    assert {pool_key(s.spec) for s in pool.ready()} == {pool_key(SandboxSpec())}
    await pool.aclose()


async def test_trims_past_the_demand_and_forgets_idle_keys():
    clock, start = Clock(), Starter()
    pool = SandboxPool(start, capacity=8, window=10.0, clock=clock)
    for _ in range(4):
        await pool.acquire(SandboxSpec())
    await eventually(lambda: len(pool.ready()) == 4, what="4 ready")
    clock.now += 11  # no acquisition for a window: no demand
    await pool.step()
    assert pool.ready() == [] and all(s.closed for s in start.made) and pool.trimmed == 4
    assert pool.status()["keys"] == 0


async def test_no_pool_at_capacity_zero_and_none_after_close():
    start = Starter()
    off = SandboxPool(start, capacity=0)
    assert await off.acquire(SandboxSpec()) is None and off.status()["keys"] == 0
    pool = SandboxPool(start, capacity=4)
    for _ in range(2):
        await pool.acquire(SandboxSpec())
    await eventually(lambda: len(pool.ready()) == 2, what="2 ready")
    await pool.aclose()
    assert start.made and all(s.closed for s in start.made)  # emptied
    made = len(start.made)
    assert await pool.acquire(SandboxSpec()) is None and len(start.made) == made
    with pytest.raises(ValueError, match="capacity"):
        SandboxPool(start, capacity=-1)


async def test_a_failing_start_backs_off_and_is_counted():
    clock, start = Clock(), Starter(fail=True)
    pool = SandboxPool(start, capacity=4, clock=clock)
    for _ in range(2):
        await pool.acquire(SandboxSpec())
    await eventually(lambda: pool.failed >= 1, what="the failed start counted")
    failed = pool.failed
    await pool.step()  # within RETRY_AFTER: not tried again
    assert pool.failed == failed and pool.ready() == []
    await pool.aclose()


async def test_files_are_written_at_acquisition_and_a_bad_one_is_refused(tmp_path):
    runtime = LocalRuntime(tmp_path)
    pool = SandboxPool(runtime.start, capacity=2)
    for _ in range(2):
        await pool.acquire(SandboxSpec())
    await eventually(lambda: len(pool.ready()) == 2, what="2 ready")
    spec = SandboxSpec(files={"pkg/task.py": "print(1)\n"}, start_timeout=7.0)
    sandbox = await pool.acquire(spec)
    assert sandbox is not None and sandbox.spec == spec
    assert (sandbox.workspace / "pkg" / "task.py").read_text() == "print(1)\n"
    result = await sandbox.exec("cat pkg/task.py", timeout=30)
    assert result.stdout == "print(1)\n"
    await sandbox.close()
    with pytest.raises(SandboxError, match="outside"):
        await pool.acquire(SandboxSpec(files={"../escape.txt": "x"}))
    assert not (tmp_path / "escape.txt").exists()
    await pool.aclose()
    assert not list((tmp_path / "sandboxes").glob("*.json"))  # every record gone


async def test_the_server_runtime_counts_only_what_it_handed_out_and_empties_the_pool(tmp_path):
    from rollserve.sandbox.registry import LazyRuntime

    lazy = LazyRuntime("local", tmp_path / "state", {"root": str(tmp_path / "boxes")}, pool=3)
    cold = [await lazy.start(SandboxSpec()) for _ in range(2)]
    assert lazy.pool is not None
    await eventually(lambda: len(lazy.pool.ready()) == 2, what="2 ready")
    status = lazy.status()
    assert status["open"] == 2 and status["started"] == 2  # the pool's are not in use
    assert status["pool"]["ready"] == 2 and status["pool"]["misses"] == 2
    warm = await lazy.start(SandboxSpec())
    assert lazy.status()["started"] == 3 and lazy.pool.hits == 1
    assert warm not in cold and warm.workspace.exists()
    await lazy.aclose()
    assert all(s.closed for s in [*cold, warm]) and lazy.pool.ready() == []
    assert not list((tmp_path / "boxes").iterdir())
    assert not list((tmp_path / "state" / "sandboxes").glob("*.json"))


async def test_a_spec_asked_for_once_starts_nothing():
    """Every task with a spec of its own (its own image): the pool starts none of them."""
    start = Starter()
    pool = SandboxPool(start, capacity=8)
    for n in range(5):
        assert await pool.acquire(SandboxSpec(image=f"/images/{n}")) is None
    await pool.step()
    assert start.made == [] and pool.misses == 5
    await pool.aclose()


class BlockedWrites(CountedSandbox):
    """Its workspace writes wait until told: an acquisition cancelled mid-way."""

    writing = False

    async def write_file(self, path, content) -> None:
        self.writing = True
        await asyncio.Event().wait()


async def test_an_acquisition_cancelled_while_writing_files_closes_the_sandbox():
    clock, made = Clock(), []

    async def start(spec: SandboxSpec) -> Sandbox:
        made.append(BlockedWrites(spec))
        return made[-1]

    pool = SandboxPool(start, capacity=4, clock=clock)
    spec = SandboxSpec(files={"a.txt": "x"})
    assert [await pool.acquire(spec) for _ in range(2)] == [None, None]  # the demand
    await eventually(lambda: len(pool.ready()) == 2, what="2 ready")
    taking = asyncio.create_task(pool.acquire(spec))
    await eventually(lambda: any(s.writing for s in made), what="one taken, its files being written")
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking
    # The one taken is held by no rollout: closed, not left to a later server's reaper.
    assert sum(s.closed for s in made) == 1 and not any(s.closed for s in pool.ready())
    await pool.aclose()


async def test_a_start_still_under_way_when_shutdown_stops_waiting_is_closed_when_it_ends(monkeypatch):
    monkeypatch.setattr(pool_module, "CLOSE_TIMEOUT", 0.05)
    clock, release, made = Clock(), asyncio.Event(), []

    async def slow_start(spec: SandboxSpec) -> Sandbox:
        await release.wait()
        made.append(CountedSandbox(spec))
        return made[-1]

    pool = SandboxPool(slow_start, capacity=4, clock=clock)
    assert [await pool.acquire(SandboxSpec()) for _ in range(2)] == [None, None]  # the demand
    await eventually(lambda: pool.status()["starting"] > 0, what="starts under way")
    await pool.aclose()  # gives up waiting after CLOSE_TIMEOUT
    release.set()
    await eventually(lambda: made and all(s.closed for s in made), what="the late starts closed")


async def test_a_sandbox_broken_while_idle_is_closed_not_handed_out():
    """What broke while it waited (``Sandbox.alive`` false) is closed at acquisition,
    the next ready one is handed out instead, and the pool starts another."""
    clock, start = Clock(), Starter()
    pool = SandboxPool(start, capacity=8, clock=clock)
    spec = SandboxSpec()
    for _ in range(3):
        await pool.acquire(spec)
    await eventually(lambda: len(pool.ready()) == 3, what="3 ready")
    first, second, _ = pool.ready()
    first.broken = True  # (the oldest: the one acquire would take)
    handed = await pool.acquire(spec)
    assert handed is second and pool.dead == 1
    await eventually(lambda: first.closed, what="the broken one closed")
    second_broken = pool.ready()[0]
    second_broken.broken = True
    await pool.step()  # a refill round drops the broken ones too, and starts others
    assert second_broken not in pool.ready() and pool.dead == 2
    await eventually(lambda: second_broken.closed and len(pool.ready()) >= 3, what="refilled past the broken")
    assert pool.status()["dead"] == 2
    await pool.aclose()


class SlowClose(CountedSandbox):
    """Its close waits until told (``release``, where set)."""

    release: asyncio.Event | None = None

    async def close(self) -> None:
        if self.release is not None:
            await self.release.wait()
        self._closed = True


async def _pool_with_a_broken_one_closing(release: asyncio.Event) -> tuple[SandboxPool, SlowClose]:
    """A pool whose oldest ready sandbox broke while idle: an acquisition set its close
    going (which waits for ``release``)."""
    made: list[SlowClose] = []

    async def start(spec: SandboxSpec) -> Sandbox:
        made.append(SlowClose(spec))
        return made[-1]

    pool = SandboxPool(start, capacity=4, clock=Clock())
    assert [await pool.acquire(SandboxSpec()) for _ in range(2)] == [None, None]  # the demand
    await eventually(lambda: len(pool.ready()) == 2, what="2 ready")
    broken = made[0]
    broken.broken, broken.release = True, release
    handed = await pool.acquire(SandboxSpec())
    assert handed is made[1] and pool.dead == 1 and not broken.closed
    handed._closed = True  # (the rollout's own close)
    return pool, broken


async def test_shutdown_waits_for_the_close_of_a_sandbox_broken_while_idle():
    release = asyncio.Event()
    pool, broken = await _pool_with_a_broken_one_closing(release)

    async def release_once_closing() -> None:
        await eventually(lambda: pool._closing, what="the shutdown begun")
        release.set()

    releasing = asyncio.create_task(release_once_closing())
    await asyncio.wait_for(pool.aclose(), 30)
    assert broken.closed  # closed before the shutdown returned, not after
    await releasing


async def test_shutdown_waits_for_a_broken_sandboxs_close_only_so_long(monkeypatch):
    monkeypatch.setattr(pool_module, "CLOSE_TIMEOUT", 0.05)
    release = asyncio.Event()
    pool, broken = await _pool_with_a_broken_one_closing(release)
    await asyncio.wait_for(pool.aclose(), 30)  # bounded: returns with the close still waiting
    assert not broken.closed
    release.set()
    await eventually(lambda: broken.closed, what="the late close done")


async def test_a_local_sandbox_whose_folders_went_is_not_alive(tmp_path):
    runtime = LocalRuntime(tmp_path / "state")
    sandbox = await runtime.start(SandboxSpec())
    assert sandbox.alive()
    shutil.rmtree(sandbox.folders.base)
    assert not sandbox.alive()
    await sandbox.close()  # (what is left of it: its owner record)
    assert not sandbox.alive()


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)
async def test_the_server_runtime_hands_out_a_working_sandbox_after_pooled_ones_broke(tmp_path):
    """The server's runtime with a pool of bubblewrap sandboxes: every ready one broken
    while idle (its folders removed: an idle bubblewrap sandbox runs no process), the
    next start still gives a sandbox that runs commands, and the broken ones are closed
    (their owner records gone)."""
    # (not under tmp_path: a root server's sandboxes run as uids of their own)
    boxes = Path(tempfile.mkdtemp(prefix="rollserve-test-pool-"))
    os.chmod(boxes, 0o755)
    try:
        await _broken_while_idle(boxes, tmp_path / "state")
    finally:
        shutil.rmtree(boxes, ignore_errors=True)


async def _broken_while_idle(boxes: Path, state: Path) -> None:
    from rollserve.sandbox.registry import LazyRuntime

    lazy = LazyRuntime("bubblewrap", state, {"root": str(boxes)}, pool=3)
    spec = SandboxSpec(files={"a.txt": "hello\n"})
    await (await lazy.start(spec)).close()  # (the first start makes the sandboxes' Python view: slow)
    cold = [await lazy.start(spec) for _ in range(2)]
    assert lazy.pool is not None
    await eventually(lambda: len(lazy.pool.ready()) >= 2, what="2 ready", timeout=60)
    idle = lazy.pool.ready()
    for sandbox in idle:
        shutil.rmtree(sandbox.folders.base)
    fresh = await lazy.start(spec)
    assert fresh not in idle and lazy.pool.dead >= 1
    result = await fresh.exec("cat a.txt", 30)
    assert result.ok and result.stdout == "hello\n", result
    await eventually(lambda: all(s.closed for s in idle), what="the broken ones closed", timeout=30)
    records = {p.stem for p in (state / "sandboxes").glob("*.json")}
    assert not records & {s.id for s in idle}
    await lazy.aclose()
    assert all(s.closed for s in [*cold, fresh])

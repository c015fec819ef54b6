"""A command's CPU budget (cpucap.py), tried the way a hanging or cheating test run
would hold cores: busy children (each under RLIMIT_CPU), orphans that left their
parent, and children that burn CPU between two readings and are gone by the next.
Real bubblewrap sandboxes, budgets of a few CPU seconds, wall timeouts far above."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.cpucap import CpuWatch, stat_times
from tests.sandbox.helpers import eventually, our_descendants

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)

WALL = 600  # far above what any of these commands may take under its budget
SPIN = "while :; do :; done"
WORK = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"  # about 1 CPU second per 250,000


@pytest.fixture
async def box(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    # cpu_seconds (RLIMIT_CPU, per process) far above the budgets: it is not what stops them
    spec = SandboxSpec(limits=SandboxLimits(cpu_seconds=3600, memory_mb=512, pids=64))
    async with await runtime.start(spec) as sandbox:
        yield sandbox


def assert_stopped_by_the_budget(result) -> None:
    assert result.cap == "cpu" and not result.timed_out and result.exit_code is None, result
    assert "finished" not in result.stdout
    assert "CPU budget of 2 s" in result.stderr and "it was killed" in result.stderr
    assert "CPU budget" in result.failure()


async def test_busy_children_are_stopped_by_the_budget(box):
    result = await box.exec(f"for i in 1 2 3; do ( {SPIN} ) & done; wait; echo fin''ished", WALL, cpu_budget=2)
    assert_stopped_by_the_budget(result)
    assert await eventually(lambda: not our_descendants(), 30)


async def test_orphans_that_left_their_parent_still_count(box):
    # Double forks and a new session: their parent is gone, bwrap's first process reaps them.
    command = f"( ( {SPIN} ) & ); setsid bash -c '{SPIN}' & disown; sleep 1000; echo fin''ished"
    result = await box.exec(command, WALL, cpu_budget=2)
    assert_stopped_by_the_budget(result)
    assert await eventually(lambda: not our_descendants(), 30)


async def test_children_gone_between_two_readings_count_once_reaped(box):
    # Short children, one after another, without end (so the budget is what stops it on
    # any CPU): nearly all come and go between two readings (0.5 s apart), unseen; their
    # time lands in the shell's cutime when it waits for them.
    command = f"while :; do bash -c '{WORK.format(n=5000)}'; done; sleep 1000; echo fin''ished"
    result = await box.exec(command, WALL, cpu_budget=2)
    assert_stopped_by_the_budget(result)


async def test_a_command_within_its_budget_is_left_alone(box):
    result = await box.exec("timeout 0.3 bash -c 'while :; do :; done'; echo fin''ished", WALL, cpu_budget=30)
    assert result.ok and result.cap is None and result.stdout.strip() == "finished"
    plain = await box.exec("echo no budget", WALL)
    assert plain.ok and plain.cap is None


async def never(used: float) -> None:
    raise AssertionError(f"no budget was passed ({used} s)")


async def test_the_count_reads_the_reaped_childrens_time(box):
    process = await box.spawn(["bash", "-c", f"bash -c '{WORK.format(n=300000)}'; sleep 1000"])
    try:
        watch = CpuWatch(process.pid, 1000.0, on_exceeded=never)
        # The child's CPU second lands in the shell's cutime once it is reaped.
        assert await eventually(lambda: watch.measure() >= 0.5, 60)
        assert watch.measure() >= 0.5 and watch.readings >= 2
        assert stat_times(process.pid) is not None
    finally:
        await process.kill()
    assert stat_times(process.pid) is None

"""The resident memory cap (``memory_mode="resident"``, sandbox/rsscap.py), tried the
way a runaway or hostile agent would: one process allocating past the cap, many
processes each under it but together over it, memory shared after a fork (counted
once) then written (counted for each copy); and what it is for: a Node process that
reserves gigabytes of address space but touches little runs under it, where it fails
under RLIMIT_AS. Real sandboxes, caps of a few hundred MB."""

from __future__ import annotations

import os
import shutil

import pytest

from rollserve.sandbox import proctree, rsscap
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.config import BubblewrapConfig
from rollserve.sandbox.diskcap import MB
from tests.sandbox.helpers import NESTED, RUNTIMES, eventually, make_runtime, rerun_unprivileged

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")

# 16 MB touched every 50 ms, up to 1 GB (64 chunks, 3.2 s): unstopped it ends "finished".
HOG = r"""
import time
held = []
for i in range(64):
    held.append(bytes([i % 250 + 1]) * (16 << 20))
    print("held_mb", 16 * (i + 1), flush=True)
    time.sleep(0.05)
time.sleep(30)
print("fin" "ished")
"""
# 8 processes of 48 MB each (each under the cap, and under RLIMIT_AS), all held at
# once: 384 MB together; then they end, or (argv "hold") hold on for 30 s.
SPREAD = r"""
import os, sys, time
held_r, held_w = os.pipe()
go_r, go_w = os.pipe()
for i in range(8):
    if os.fork() == 0:
        mine = bytes([i + 1]) * (48 << 20)
        os.write(held_w, b"1")
        os.read(go_r, 1)
        os._exit(0)
got = b""
while len(got) < 8:
    got += os.read(held_r, 8)
print("all held", flush=True)
if sys.argv[1] == "hold":
    time.sleep(30)
os.close(go_w)
print("fin" "ished")
"""
# 96 MB touched in a parent, then 4 children that share it (copy-on-write): RSS
# counts it 5 times (~500 MB), the sandbox holds it once. With "write" each child
# makes its own copy: 96 MB more each.
SHARED = r"""
import os, sys, time
data = b"s" * (96 << 20)
for i in range(4):
    if os.fork() == 0:
        if sys.argv[1] == "write":
            mine = bytearray(data)
        time.sleep(60)
        os._exit(0)
print("forked", flush=True)
time.sleep(60)
"""
# Page tables without resident pages: 1 TB reserved, one byte read every 2 MB (the
# shared zero page: no RSS; a 4 KB page table each: 2 GB of them in all).
PAGE_TABLES = r"""
import mmap
size = 1 << 40
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)  # NORESERVE
total = 0
for offset in range(0, size, 2 << 20):
    total += m[offset]
print("fin" "ished")
"""
# Reserves 4 GB of address space (a WebAssembly memory's guard region, a 3 GB
# ArrayBuffer nobody writes) and touches a few MB.
NODE_RESERVES = (
    "const m = new WebAssembly.Memory({initial: 1, maximum: 65536}); "
    "const b = new ArrayBuffer(3 * 2 ** 30); "
    "console.log('reserved', m.buffer.byteLength, b.byteLength)"
)


HOG_RATE = 16 * MB / 0.05  # the hogs' fastest: 16 MB, then a sleep of 50 ms (load only slows them)


def overshoot_bound(watch, rate: float = HOG_RATE, step: int = 16 * MB) -> float:
    """The most a hog allocating at ``rate`` (in ``step`` chunks) can hold when killed:
    the reading before the kill was under the cap, and from it to the kill it ran for
    the gap between the two readings, the killing reading and the kill, all measured
    (a loaded machine stretches them, and the bound with them)."""
    return watch.limit + rate * (watch.gap_seconds + watch.reading_seconds + watch.kill_seconds) + step


def resident(memory_mb: int) -> SandboxLimits:
    return SandboxLimits(memory_mb=memory_mb, pids=64, memory_mode="resident")


def check_resident(runtime) -> None:
    if getattr(runtime, "cgroup_parent", None) is not None:
        pytest.skip("a cgroup bounds this sandbox's memory (memory.max), not the watcher")


@pytest.fixture(params=[name for name in RUNTIMES if name in ("bubblewrap", "local")])
def runtime(request, tmp_path):
    made = make_runtime(request.param, tmp_path / "state")
    check_resident(made)
    return made


async def test_one_process_past_the_cap_is_killed_near_it(runtime):
    assert "resident memory of all the sandbox's processes" in runtime.caps()["memory_mode"]
    async with await runtime.start(SandboxSpec(limits=resident(128))) as box:
        result = await box.exec(["python3", "-c", HOG], 60)
        assert result.cap == "memory" and not result.ok, result
        assert "finished" not in result.stdout
        assert "reached its memory cap" in result.stderr and "resident" in result.stderr
        held = [int(line.split()[1]) for line in result.stdout.split("\n") if line]
        # Stopped near the cap (16 MB every 50 ms: ~32 MB a 0.1 s poll), not at 1 GB:
        # within what it can allocate between two readings and the kill, as measured.
        bound = overshoot_bound(box.resident)
        assert held[-1] * MB <= bound, (held, bound / MB)
        assert 128 * MB < box.resident.killed_at <= bound, (box.resident.killed_at / MB, bound / MB)
        # The sandbox stays usable: only what ran was killed.
        assert (await box.exec("echo still usable", 10)).stdout == "still usable\n"


@needs_bwrap
async def test_many_processes_each_under_the_cap_are_caught_together(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)
    # Address space per process (the default): each of the 8 is under 256 MB, so all run.
    spec = SandboxSpec(limits=SandboxLimits(memory_mb=256, pids=64))
    async with await runtime.start(spec) as box:
        assert box.resident is None
        result = await box.exec(["python3", "-c", SPREAD, "end"], 60)
        assert result.ok and result.stdout == "all held\nfinished\n", result
    # Resident for the sandbox: 384 MB together is past 256 MB.
    async with await runtime.start(SandboxSpec(limits=resident(256))) as box:
        result = await box.exec(["python3", "-c", SPREAD, "hold"], 60)
        assert result.cap == "memory" and "finished" not in result.stdout, result
        assert box.resident.killed_at > 256 * MB


@needs_bwrap
async def test_pages_shared_after_a_fork_count_once_and_copies_each(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)
    async with await runtime.start(SandboxSpec(limits=resident(256))) as box:
        process = await box.spawn(["python3", "-c", SHARED, "share"])
        watch = box.resident
        # Their RSS together is past the cap (~500 MB); what they hold (PSS) is not.
        await eventually(
            lambda: watch.how == "pss" and watch.used > 96 * MB,
            timeout=60,
            what="a reading of the shared pages past the RSS cap",
        )
        assert watch.kills == 0 and process.returncode is None and watch.used < 256 * MB
        await process.kill()
        copied = await box.exec(["python3", "-c", SHARED, "write"], 60)
        assert copied.cap == "memory" and watch.killed_at > 256 * MB, copied


# 256 MB of MAP_SHARED memory, touched, then 24 children that each read all of it: RSS
# counts it 25 times (6.4 GB), the sandbox holds it once (PSS ~300 MB with the
# interpreters). Every PSS pass walks all 25 mappings' page tables.
MANY_SHARERS = r"""
import mmap, os, time
size = 256 << 20
m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
chunk = b"x" * (1 << 20)
for offset in range(0, size, len(chunk)):
    m[offset:offset + len(chunk)] = chunk
for i in range(24):
    if os.fork() == 0:
        total = sum(m[offset] for offset in range(0, size, 4096))
        time.sleep(120)
        os._exit(0)
print("forked", flush=True)
time.sleep(120)
"""


@needs_bwrap
async def test_shared_pages_past_the_rss_cap_do_not_make_every_poll_a_pss_pass(tmp_path):
    """A sandbox that keeps its RSS sum past the cap while holding less (many children
    sharing one mapping) gets a PSS pass no sooner after the last one than that one
    took, not one every poll (the polls in between are "deferred"); a process that then
    really goes past the cap is still killed, with all the sandbox's processes."""
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(resident_poll=0.02))
    check_resident(runtime)
    async with await runtime.start(SandboxSpec(limits=resident(512))) as box:
        sharers = await box.spawn(["python3", "-c", MANY_SHARERS])
        watch = box.resident
        # (A pass over 25 x 256 MB of page tables takes longer than the 0.02 s poll.)
        await eventually(
            lambda: watch.counts["pss"] >= 3 and watch.counts["deferred"] >= 3,
            timeout=120,
            what="PSS passes, and polls in between that defer one",
        )
        assert watch.kills == 0 and sharers.returncode is None, (watch.counts, watch.used / MB)
        result = await box.exec(["python3", "-c", HOG], 60)
        assert result.cap == "memory" and "finished" not in result.stdout, result
        assert watch.killed_at > 512 * MB
        await eventually(lambda: sharers.returncode is not None, timeout=30, what="the sharers killed with the hog")


# As MANY_SHARERS, then (argv "swap") each child, one after the other, unmaps its view
# of the shared mapping and fills as much private memory: the RSS sum stays about where
# it was while what the sandbox holds grows by 256 MB a child.
SWAPPERS = MANY_SHARERS.replace(
    "        time.sleep(120)\n",
    """        time.sleep(0.1 * i)
        m.close()
        mine = b"p" * size
        time.sleep(120)
""",
)


@needs_bwrap
async def test_shared_pages_swapped_for_private_ones_are_still_caught(tmp_path):
    """What a rule "no PSS until the RSS sum grows by the headroom" would miss: the RSS
    sum stays flat while shared pages become private ones. PSS passes still come, so
    the sandbox is killed."""
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(resident_poll=0.02))
    check_resident(runtime)
    async with await runtime.start(SandboxSpec(limits=resident(512))) as box:
        result = await box.exec(["python3", "-c", SWAPPERS], 120)
        assert result.cap == "memory" and box.resident is not None, result
        assert box.resident.killed_at > 512 * MB


@needs_bwrap
async def test_page_tables_count(tmp_path):
    """RLIMIT_AS bounded page tables with the address space; without it they count."""
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)
    async with await runtime.start(SandboxSpec(limits=resident(128))) as box:
        result = await box.exec(["python3", "-c", PAGE_TABLES], 120)
        assert result.cap == "memory" and "finished" not in result.stdout, result
        # Stopped before all its page tables (2 GB: 4 KB for each 2 MB of its 1 TB).
        assert 128 * MB < box.resident.killed_at < 2048 * MB


@needs_bwrap
@needs_node
async def test_node_reserving_address_space_runs_under_the_resident_cap(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)
    command = ["node", "-e", NODE_RESERVES]
    async with await runtime.start(SandboxSpec(limits=SandboxLimits(memory_mb=2048))) as box:
        refused = await box.exec(command, 60)  # RLIMIT_AS 2 GB: the reservation fails
        assert not refused.ok and "could not allocate memory" in refused.stderr, refused
    async with await runtime.start(SandboxSpec(limits=resident(2048))) as box:
        ran = await box.exec(command, 60)
        assert ran.ok and ran.stdout == "reserved 65536 3221225472\n", ran
        assert box.resident.kills == 0


@needs_bwrap
@needs_node
async def test_a_node_process_allocating_past_the_cap_is_killed(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)
    # 16 MB written every 50 ms, kept: unstopped, 1 GB and "finished".
    hog = (
        "const held = []; let i = 0; const t = setInterval(() => { "
        "held.push(Buffer.alloc(16 << 20, i + 1)); i += 1; "
        "if (i === 64) { clearInterval(t); console.log('fin' + 'ished'); } }, 50);"
    )
    async with await runtime.start(SandboxSpec(limits=resident(192))) as box:
        result = await box.exec(["node", "-e", hog], 60)
        assert result.cap == "memory" and "finished" not in result.stdout, result
        bound = overshoot_bound(box.resident)
        assert 192 * MB < box.resident.killed_at <= bound, (box.resident.killed_at / MB, bound / MB)


@pytest.mark.parametrize("by_children", [True, False], ids=["children-files", "all-of-proc"])
def test_the_tree_walk_finds_every_descendant_and_nothing_else(by_children):
    """``tree_pids``, from the threads' children files or (a kernel without them) from
    every process's parent in /proc, equals psutil's full /proc scan."""
    import subprocess

    import psutil

    tree = subprocess.Popen(
        [
            "python3",
            "-c",
            "import subprocess, sys, threading\n"
            "kids = [subprocess.Popen(['sleep', '30']) for _ in range(3)]\n"
            "t = threading.Thread(target=lambda: subprocess.run(['sleep', '30']))\n"
            "t.start(); print('up', flush=True); t.join()",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert tree.stdout is not None and tree.stdout.readline() == b"up\n"
        expected = wait_for_children(tree.pid, 4)
        assert proctree.tree_pids([tree.pid], by_children) == sorted([tree.pid, *expected])
        assert rsscap.resident_usage([tree.pid], 1 << 40)[1] == "rss"
        assert rsscap.resident_usage([tree.pid], 0)[1] == "pss"
        assert rsscap.resident_usage([tree.pid], 0, pss=False)[1] == "deferred"
        # No time for PSS: every process counts its RSS (an upper bound).
        rss, how = rsscap.resident_usage([tree.pid], 0, budget=-1)
        assert how == "pss+rss" and rss >= rsscap.resident_usage([tree.pid], 1 << 40)[0] // 2
        gone = 2**22 + 1
        assert proctree.tree_pids([gone], by_children) == [gone]  # (no children)
    finally:
        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()


@needs_bwrap
async def test_without_children_files_the_cap_still_sees_the_whole_sandbox(tmp_path, monkeypatch):
    """On a kernel without ``/proc/PID/task/TID/children`` (no CONFIG_PROC_CHILDREN) a
    walk through them sees only the runtime's own processes (bwrap: a few MB), so the
    cap would never fire; there the walk goes by every process's parent instead."""
    runtime = BubblewrapRuntime(tmp_path / "state")
    check_resident(runtime)

    def no_children_files(roots):
        raise AssertionError("walked the children files on a kernel without them")

    monkeypatch.setattr(proctree, "children_files", lambda: False)
    monkeypatch.setattr(proctree, "_by_children", no_children_files)
    async with await runtime.start(SandboxSpec(limits=resident(128))) as box:
        result = await box.exec(["python3", "-c", HOG], 60)
        assert result.cap == "memory" and "finished" not in result.stdout, result
        assert 128 * MB < box.resident.killed_at <= overshoot_bound(box.resident)


def wait_for_children(pid: int, count: int) -> list[int]:
    import psutil

    from tests.waiting import wait_until

    return wait_until(
        lambda: (
            [c.pid for c in psutil.Process(pid).children(recursive=True)]
            if len(psutil.Process(pid).children(recursive=True)) >= count
            else None
        ),
        timeout=30,
        what=f"{count} children",
    )


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: this run is that case")
@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="nested run")
def test_resident_cap_as_an_unprivileged_user(tmp_path):
    rerun_unprivileged(__file__, tmp_path)


def test_past_the_rss_limit_the_largest_processes_are_read_first(monkeypatch):
    """Past the limit PSS is read largest first (by RSS + page tables), so the
    reading stops early and a budget spent still counted the big ones by PSS."""
    sizes = {1: (1, 300 * MB, 0), 2: (2, 10 * MB, 0), 3: (3, 20 * MB, 1 * MB), 4: (4, 5 * MB, 0)}
    read = []
    monkeypatch.setattr(rsscap, "tree_pids", lambda roots: list(sizes))
    monkeypatch.setattr(rsscap, "rss_bytes", lambda pid: sizes[pid])

    def pss(pid):
        read.append(pid)
        return sizes[pid][1]

    monkeypatch.setattr(rsscap, "pss_bytes", pss)
    used, how = rsscap.resident_usage([0], 250 * MB)
    assert how == "pss" and used > 250 * MB and read == [1]
    read.clear()
    used, how = rsscap.resident_usage([0], 330 * MB, budget=60.0)
    assert how == "pss" and read == [1, 3, 2] and used == 331 * MB

"""cgroup v2 support: the files written, on a folder laid out like a delegated cgroup;
the mechanism, on a real cgroup v2 folder where the host lets us make one; the memory
cap itself where a delegated cgroup with the memory controller exists (this CI
machine has none: only hugetlb is enabled in its cgroup v2 hierarchy)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from rollserve.sandbox import cgroups
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapConfig, BubblewrapRuntime
from tests.sandbox.helpers import our_descendants, wait_until


def fake_parent(tmp_path, controllers="cpu memory pids"):
    (tmp_path / "cgroup.subtree_control").write_text(controllers + "\n")
    return tmp_path


def test_usable_parent_needs_memory_and_pids(tmp_path):
    assert cgroups.usable_parent(fake_parent(tmp_path)) is None
    assert "not enabled" in cgroups.usable_parent(fake_parent(tmp_path, "cpu pids"))
    assert "not a cgroup v2 folder" in cgroups.usable_parent(tmp_path / "missing")


def test_find_parent_configured_off_and_auto(tmp_path):
    assert cgroups.find_parent("off") == (None, "cgroups disabled in the configuration")
    assert cgroups.find_parent(str(fake_parent(tmp_path))) == (tmp_path, "configured")
    parent, reason = cgroups.find_parent("auto")  # whatever this host offers, with a reason
    assert parent is not None or reason


def test_create_writes_the_limits_and_adds_processes(tmp_path):
    path = cgroups.create(fake_parent(tmp_path), "rollserve-x", SandboxLimits(memory_mb=64, pids=32))
    assert (path / "memory.max").read_text() == str(64 << 20)
    assert (path / "memory.swap.max").read_text() == "0"
    assert (path / "pids.max").read_text() == "32"
    cgroups.add_process(path, 1234)
    assert (path / "cgroup.procs").read_text() == "1234"
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroups.memory_events(path)["oom_kill"] == 1


def test_auto_never_takes_a_merely_writable_folder(tmp_path, monkeypatch):
    # Writable with controllers enabled, but not marked delegated: not ours to use.
    fake_parent(tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: tmp_path / "leaf")
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: tmp_path.parent.parent)
    parent, reason = cgroups.find_parent("auto")
    assert parent is None and "delegated" in reason
    monkeypatch.setattr(cgroups, "delegated", lambda path: path == tmp_path)
    assert cgroups.find_parent("auto") == (tmp_path, "delegated")


def _writable_cgroup2() -> str | None:
    """Why a cgroup cannot be made here for a real test, or None."""
    mount = cgroups.cgroup2_mount()
    if mount is None:
        return "no cgroup v2 hierarchy"
    if not os.access(mount, os.W_OK):
        return f"{mount} is not writable"
    if BubblewrapRuntime.unavailable_reason():
        return BubblewrapRuntime.unavailable_reason()
    return None


@pytest.fixture
def cgroup_parent():
    """A fresh cgroup v2 folder to put sandboxes' cgroups under, removed afterwards."""
    parent = cgroups.cgroup2_mount() / f"rollserve-test-{uuid.uuid4().hex[:8]}"
    parent.mkdir()
    yield parent
    for child in parent.iterdir():
        if child.is_dir():
            cgroups.remove_cgroup(child)
    parent.rmdir()


def _cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


@pytest.mark.skipif(_writable_cgroup2() is not None, reason=f"{_writable_cgroup2()}")
async def test_a_sandbox_lives_and_dies_in_a_cgroup_of_its_own(tmp_path, cgroup_parent, monkeypatch):
    """The real cgroup path, on what this host offers: a cgroup v2 folder without the
    memory and pids controllers (none is delegated here), so the mechanism — every
    process of the sandbox in its cgroup, all of it killed through cgroup.kill at
    close — runs for real, and the limits' files are written where the controllers
    exist (test_create_writes_the_limits_and_adds_processes)."""
    monkeypatch.setattr(cgroups, "NEEDED", set())  # no controller to ask of this host
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(cgroup=str(cgroup_parent)))
    assert runtime.cgroup_parent == cgroup_parent
    assert runtime.caps()["memory_mb"].startswith("cgroup v2 memory.max for the whole sandbox")
    box = await runtime.start(SandboxSpec(limits=SandboxLimits(memory_mb=256, pids=32)))
    try:
        assert box.cgroup.parent == cgroup_parent
        # With a cgroup, memory is the cgroup's business: no per-process RLIMIT_AS.
        assert not any(arg.startswith("--as=") for arg in box.prefix)
        await box.spawn(["bash", "-c", "sleep 600 & sleep 600 & wait"])
        await box.spawn(["sleep", "600"], pty=True)  # each command is its own bwrap
        assert wait_until(lambda: len([p for p in our_descendants() if p.name() == "sleep"]) == 3)
        inside = [p for p in our_descendants() if p.name() == "sleep"]
        name = "/" + str(box.cgroup.relative_to(cgroups.cgroup2_mount()))
        assert {_cgroup_of(p.pid) for p in inside} == {name}
    finally:
        await box.close()
    assert not box.cgroup.exists()  # killed through cgroup.kill, then removed
    assert wait_until(lambda: not [p for p in our_descendants() if p.name() == "sleep"])


@pytest.mark.skipif(
    cgroups.find_parent("auto")[0] is None,
    reason=f"no delegated cgroup v2 with memory and pids here: {cgroups.find_parent('auto')[1]}",
)
async def test_memory_is_capped_for_the_whole_sandbox_with_a_cgroup(tmp_path):
    """Three processes of 100 MB each under a 200 MB cap: together they cannot all
    live (per-process RLIMIT_AS would let each of them)."""
    runtime = BubblewrapRuntime(tmp_path / "state")
    hog = "python3 -c 'import time; x = b\"x\" * (100 << 20); time.sleep(5)'"
    async with await runtime.start(SandboxSpec(limits=SandboxLimits(memory_mb=200))) as box:
        result = await box.exec(f"{hog} & a=$!; {hog} & b=$!; {hog} & c=$!; wait $a && wait $b && wait $c", 60)
    assert not result.ok and result.cap == "memory" and "memory cap" in result.stderr, result

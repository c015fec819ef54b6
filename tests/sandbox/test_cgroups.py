"""cgroup v2 support, on a folder laid out like a delegated cgroup (this machine has no
delegated cgroup v2 with memory and pids, so the real thing cannot run here)."""

from __future__ import annotations

from rollserve.sandbox import cgroups
from rollserve.sandbox.base import SandboxLimits


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

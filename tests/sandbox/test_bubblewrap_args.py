"""How a bubblewrap invocation is put together (the behaviour itself is tested in
test_runtimes.py and test_escape.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapConfig, BubblewrapRuntime
from rollserve.sandbox.bwrap_view import root_binds
from rollserve.sandbox.limits import rlimits


def test_root_binds_a_rootfs_top_level_read_only(tmp_path):
    (tmp_path / "usr").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    args = list(root_binds(str(tmp_path)))
    assert ["--symlink", "usr/bin", "/bin"] == args[:3]
    assert ["--ro-bind-try", str(tmp_path / "etc"), "/etc"] == args[3:6]
    assert ["--ro-bind-try", str(tmp_path / "usr"), "/usr"] == args[6:9]
    assert "/proc" not in args  # a fresh /proc is mounted instead


@pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="no bwrap")
@pytest.mark.skipif(not os.access("/", os.W_OK), reason="needs to create a top-level folder")
async def test_a_top_level_folder_removed_while_serving_breaks_no_sandbox(tmp_path):
    """A folder of / that disappears (removed by anyone, any time) must not break the
    sandboxes that start later, nor the commands of one already open."""
    folder = Path(f"/rollserve-test-{uuid.uuid4().hex[:8]}")
    folder.mkdir()
    try:
        runtime = BubblewrapRuntime(tmp_path / "state")
        async with await runtime.start(SandboxSpec()) as before:
            assert (await before.exec(f"test -d {folder} && echo seen", 10)).stdout == "seen\n"
            folder.rmdir()
            after_removal = await before.exec("echo still works", 10)
            assert after_removal.stdout == "still works\n", after_removal.stderr
        async with await runtime.start(SandboxSpec()) as later:
            result = await later.exec(f"echo works; test -e {folder} || echo gone", 10)
            assert result.stdout == "works\ngone\n", result.stderr
    finally:
        if folder.exists():
            folder.rmdir()


@pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="no bwrap")
async def test_invocation_isolates_and_hides(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(root=tmp_path / "boxes"))
    async with await runtime.start(SandboxSpec()) as box:
        args = box.mounts
        assert args[:4] == ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        assert "--share-net" not in args
        joined = " ".join(args)
        assert f"--bind {box.workspace} /workspace" in joined
        assert f"--bind {box.folders.tmp} /tmp" in joined
        assert "--tmpfs /root" in joined and "--remount-ro /root" in joined
        # The sandboxes' folders are not visible to each other: under /tmp (replaced by
        # the sandbox's own) or, anywhere else, hidden.
        assert str(tmp_path).startswith("/tmp/")
        if os.geteuid() == 0:
            assert "setpriv" in box.prefix
            assert box.uid is not None and box.uid >= 1_100_000_000
            assert os.stat(box.workspace).st_uid == box.uid
    async with await runtime.start(SandboxSpec(network=True)) as box:
        assert "--share-net" in box.mounts


def test_sandbox_root_and_state_dir_outside_tmp_are_hidden(tmp_path):
    elsewhere = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        (elsewhere / "boxes").mkdir()
        runtime = BubblewrapRuntime(elsewhere / "state", BubblewrapConfig(root=elsewhere / "boxes"))
        assert {str(elsewhere / "boxes"), str(elsewhere / "state")} <= set(runtime.hidden())
    finally:
        shutil.rmtree(elsewhere)


def test_hidden_folders_are_outermost_only(tmp_path):
    outer = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        (outer / "state").mkdir()
        runtime = BubblewrapRuntime(outer / "state", BubblewrapConfig(hide=[str(outer)], root=tmp_path))
        hidden = runtime.hidden()  # (and every checkout of rollserve: test_answers.py)
        assert str(outer) in hidden and str(outer / "state") not in hidden  # outermost
        assert not [h for h in hidden if h.startswith(str(tmp_path))]  # in /tmp anyway
    finally:
        shutil.rmtree(outer)


def test_limits_never_exceed_our_own_hard_limits():
    import resource

    from rollserve.sandbox.base import SandboxLimits

    values = rlimits(SandboxLimits(open_files=10**9), nproc=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert values[resource.RLIMIT_NOFILE] <= (hard if hard != resource.RLIM_INFINITY else 10**9)
    assert values[resource.RLIMIT_CORE] == 0


@pytest.fixture
def shared_folder():
    """A folder under /var/tmp (hidden in sandboxes, open to other users)."""
    folder = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rollserve-ro-"))
    os.chmod(folder, 0o755)
    (folder / "bin").mkdir()
    tool = folder / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool-ok\n")
    tool.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="no bwrap")
async def test_readonly_paths_are_shown_under_a_hidden_folder(tmp_path, shared_folder):
    config = BubblewrapConfig(readonly_paths=[str(shared_folder)])
    runtime = BubblewrapRuntime(tmp_path / "state", config)
    async with await runtime.start(SandboxSpec()) as box:
        result = await box.exec(
            f"ls -A /var/tmp; {shared_folder}/bin/tool; touch {shared_folder}/x || echo refused", 10
        )
    # /var/tmp stays hidden but for the bound path, which is there and read-only.
    assert result.stdout.split() == [shared_folder.name, "tool-ok", "refused"]
    assert not (shared_folder / "x").exists()


def test_the_servers_python_is_shared_when_a_hidden_folder_covers_it(tmp_path, shared_folder, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "base_prefix", str(shared_folder))
    runtime = BubblewrapRuntime(tmp_path / "state")
    assert str(shared_folder) in runtime.readonly_paths()
    assert str(shared_folder) not in runtime.readonly_paths(root=str(tmp_path))  # a rootfs: no
    off = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(share_interpreter=False))
    assert off.readonly_paths() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run as their own uid only as root")
def test_a_path_closed_to_the_sandbox_uid_is_left_out_with_a_reason(tmp_path, caplog):
    closed = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rollserve-closed-"))  # mode 700
    try:
        (closed / "python").mkdir()
        runtime = BubblewrapRuntime(
            tmp_path / "state", BubblewrapConfig(readonly_paths=[str(closed / "python")], share_interpreter=False)
        )
        assert runtime.readonly_paths() == []
        assert "closed to other users" in caplog.text and str(closed) in caplog.text
    finally:
        shutil.rmtree(closed)

"""A spec's ``folders``: top-level folders of the sandbox's own (Harbor's /tests and
/logs), empty at start, writable inside, outside the workspace, gone at close."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxError, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.local import LocalRuntime


@pytest.mark.parametrize("bad", ["tests", "/a/b", "/tmp", "/workspace", "/"])
def test_a_folder_is_a_top_level_path_not_a_reserved_one(bad):
    with pytest.raises(ValueError):
        SandboxSpec(folders=[bad])


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_own_folders_are_the_sandbox_s_and_not_the_workspace(tmp_path):
    runtime = BubblewrapRuntime(state_dir=tmp_path)
    async with await runtime.start(SandboxSpec(folders=["/tests", "/logs"])) as box:
        made = await box.exec(
            "ls -A /tests | wc -l; mkdir /logs/v && echo 1 > /logs/v/r && ls -A /workspace | wc -l", timeout=30
        )
        assert made.ok and made.stdout.split() == ["0", "0"], made
        assert (box.folders.own("/logs") / "v" / "r").read_text() == "1\n"
        base = box.folders.base
    assert not base.exists()


async def test_the_local_runtime_cannot_make_them(tmp_path):
    with pytest.raises(SandboxError, match="folders"):
        await LocalRuntime(state_dir=tmp_path).start(SandboxSpec(folders=["/tests"]))

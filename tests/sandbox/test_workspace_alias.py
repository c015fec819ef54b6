"""Workspace aliases (the workspace also mounted at e.g. /testbed) and the workspace
seed (an image folder copied in at start), on bubblewrap; the spec's checks."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.sandbox.base import SandboxError, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapConfig, BubblewrapRuntime
from rollserve.sandbox.local import LocalRuntime

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


@pytest.fixture
def image_folder():
    """A folder of the host root every sandbox uid can read (a root server's sandboxes
    cannot enter pytest's tmp_path, which is private to root); /var/tmp is hidden by
    default, so the test's runtime shows it."""
    folder = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rollserve-seed-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@needs_bwrap
async def test_seed_then_alias_on_bubblewrap(tmp_path, image_folder):
    seed = image_folder / "testbed"
    (seed / "pkg").mkdir(parents=True)
    (seed / "pkg" / "mod.py").write_text("X = 1\n")
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(hide=["/root", "/home", "/run"]))
    spec = SandboxSpec(workspace_seed=str(seed), workspace_aliases=["/testbed"])
    async with await runtime.start(spec) as box:
        assert (box.workspace / "pkg" / "mod.py").read_text() == "X = 1\n"  # seeded
        result = await box.exec(
            "echo 'X = 2' > /testbed/pkg/mod.py && cat /workspace/pkg/mod.py && cd /testbed && pwd -P >/dev/null && ls",
            10,
        )
        assert result.ok, result.stderr
        assert result.stdout.splitlines() == ["X = 2", "pkg"]  # one folder, two places
    assert seed.joinpath("pkg", "mod.py").read_text() == "X = 1\n"  # the image is untouched


@needs_bwrap
async def test_a_missing_seed_is_a_sandbox_error_and_leaves_nothing(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    with pytest.raises(SandboxError, match="could not copy /nowhere"):
        await runtime.start(SandboxSpec(workspace_seed="/nowhere"))
    assert not list((tmp_path / "state").glob("**/*.json"))  # no owner record left


@pytest.mark.parametrize("alias", ["testbed", "/", "/tmp", "/workspace", "/usr", "/a/b"])
def test_aliases_must_be_free_top_level_paths(alias):
    with pytest.raises(ValidationError, match="top-level"):
        SandboxSpec(workspace_aliases=[alias])


def test_seed_must_be_absolute():
    with pytest.raises(ValidationError, match="absolute"):
        SandboxSpec(workspace_seed="testbed")


async def test_local_runtime_refuses_aliases(tmp_path):
    with pytest.raises(SandboxError, match="mount namespace"):
        await LocalRuntime(tmp_path / "state").start(SandboxSpec(workspace_aliases=["/testbed"]))


@needs_bwrap
@pytest.mark.skipif(not os.access("/", os.W_OK), reason="needs to create a top-level folder")
async def test_a_seed_at_the_aliased_path_is_copied_before_the_alias_hides_it(tmp_path):
    """The swe handler's image mode: the seed and the alias are the same path
    (/testbed). The copy must see the image's folder, not the (empty) workspace that
    the alias puts there."""
    top = Path(f"/rollserve-testbed-{uuid.uuid4().hex[:8]}")
    (top / "pkg").mkdir(parents=True)
    try:
        (top / "pkg" / "mod.py").write_text("X = 1\n")
        top.chmod(0o755)
        (top / "pkg").chmod(0o755)
        runtime = BubblewrapRuntime(tmp_path / "state")
        spec = SandboxSpec(workspace_seed=str(top), workspace_aliases=[str(top)])
        async with await runtime.start(spec) as box:
            assert (box.workspace / "pkg" / "mod.py").read_text() == "X = 1\n"
            result = await box.exec(f"cat {top}/pkg/mod.py", 10)
            assert result.stdout == "X = 1\n", result.stderr
    finally:
        shutil.rmtree(top)

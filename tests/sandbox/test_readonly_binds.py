"""``SandboxSpec.readonly_binds``: a host folder (a harness's install) shown read-only
at a new top-level path inside, on bubblewrap for real and in the docker/apptainer
command lines; the local runtime refuses it; the spec checks the paths."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.sandbox.base import SandboxError, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.docker import DockerConfig, DockerRuntime
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.local import LocalRuntime


@pytest.fixture
def host_folder():
    """A folder a root server's sandbox uid can read (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="rollserve-bind-", dir="/tmp"))
    folder.chmod(0o755)
    (folder / "bin").mkdir()
    (folder / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (folder / "bin" / "tool").chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)
async def test_a_bound_folder_runs_and_cannot_be_written_on_bubblewrap(tmp_path, host_folder):
    runtime = BubblewrapRuntime(tmp_path / "state")
    spec = SandboxSpec(readonly_binds={"/.harness": str(host_folder)})
    async with await runtime.start(spec) as box:
        ran = await box.exec("/.harness/bin/tool", 30)
        assert ran.ok and ran.stdout == "tool ran\n", ran.stderr
        wrote = await box.exec("echo x > /.harness/planted; rm -f /.harness/bin/tool", 30)
        assert not wrote.ok
    assert sorted(p.name for p in host_folder.rglob("*")) == ["bin", "tool"]


def test_docker_binds_it_read_only(tmp_path):
    runtime = DockerRuntime(tmp_path / "state", DockerConfig())
    folders = SandboxFolders.create(tmp_path, "dock-1")
    argv = runtime.run_command(SandboxSpec(readonly_binds={"/.harness": "/opt/h/codex"}), "c", folders)
    assert "-v /opt/h/codex:/.harness:ro" in " ".join(argv)


async def test_the_local_runtime_refuses_it(tmp_path):
    with pytest.raises(SandboxError, match="readonly_binds need a mount namespace"):
        await LocalRuntime(tmp_path / "state").start(SandboxSpec(readonly_binds={"/.h": "/opt"}))


@pytest.mark.parametrize(
    "inside, host",
    [
        ("/tmp", "/opt"),
        ("/workspace", "/opt"),
        ("/a/b", "/opt"),
        ("rel", "/opt"),
        ("/.h", "opt"),
        ("/.h", "/opt/../etc"),
    ],
)
def test_bind_paths_are_checked(inside, host):
    with pytest.raises(ValidationError):
        SandboxSpec(readonly_binds={inside: host})

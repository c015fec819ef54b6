"""The docker/podman runtime: command lines here; real containers only where an engine
can run one (with an image already present: nothing is pulled in tests)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from rollserve.sandbox.base import SandboxError, SandboxLimits, SandboxSpec
from rollserve.sandbox.docker import DockerConfig, DockerRuntime, DockerSandbox, engine_unavailable_reason
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.owner import OwnerBook


def test_run_command_carries_limits_network_and_binds(tmp_path):
    runtime = DockerRuntime(tmp_path / "state", DockerConfig(runtime="podman"))
    folders = SandboxFolders.create(tmp_path, "dock-1")
    spec = SandboxSpec(
        image="python:3.12-slim",
        env={"A": "1"},
        limits=SandboxLimits(memory_mb=256, pids=64, open_files=512, cpu_seconds=30, tmpfs_mb=16, disk_mb=100),
    )
    argv = runtime.run_command(spec, "rollserve-dock-1", folders)
    assert argv[:5] == ["podman", "--runtime", "runc", "run", "-d"]
    joined = " ".join(argv)
    assert "--storage-opt" not in joined  # only where the storage driver can (rootfs_size)
    for part in [
        "--network none",
        "--memory 256m",
        "--memory-swap 256m",
        "--pids-limit 64",
        "--ulimit nofile=512:512",
        "--ulimit cpu=30:30",
        "--shm-size 16m",
        f"-v {folders.workspace}:/workspace",
        f"-v {folders.tmp}:/tmp",
        "-w /workspace",
        "-e A=1",
        "-e HOME=/tmp",
        "--name rollserve-dock-1",
        "--label rollserve.owner=",
    ]:
        assert part in joined, part
    assert argv[-3:] == ["python:3.12-slim", "sleep", "infinity"]
    sized = DockerRuntime(tmp_path / "state", DockerConfig(runtime="podman", rootfs_size=True))
    assert "--storage-opt size=100m" in " ".join(sized.run_command(spec, "c", folders))
    docker = DockerRuntime(tmp_path / "state")
    networked = docker.run_command(SandboxSpec(network=True), "c", folders)
    assert networked[:3] == ["docker", "run", "-d"] and "--network bridge" in " ".join(networked)
    assert networked[-3] == DockerConfig().default_image


def test_hidden_paths_are_covered_by_an_empty_read_only_folder(tmp_path):
    # e.g. R2E's /r2e_tests: the image holds the hidden tests; the agent must not read them.
    runtime = DockerRuntime(tmp_path / "state")
    folders = SandboxFolders.create(tmp_path, "dock-h")
    argv = runtime.run_command(SandboxSpec(hide=["/r2e_tests"]), "c", folders)
    assert argv[argv.index(f"{folders.base / 'empty'}:/r2e_tests:ro") - 1] == "-v"
    assert argv.index("-v", argv.index("-w")) < argv.index(DockerConfig().default_image)
    plain = " ".join(runtime.run_command(SandboxSpec(), "c", folders))
    # Only the server's own folder (the gateway socket's) is read-only without a hide.
    assert f"-v {folders.server}:/.rollserve:ro" in plain
    assert ":ro" not in plain.replace(f"{folders.server}:/.rollserve:ro", "")


def test_exec_command_lines(tmp_path):
    runtime = DockerRuntime(tmp_path / "state", DockerConfig(runtime="docker"))
    folders = SandboxFolders.create(tmp_path, "dock-2")
    entry = OwnerBook(None).open("dock-2", "docker", [])
    box = DockerSandbox(runtime, "dock-2", SandboxSpec(), folders, entry, "rollserve-dock-2")
    assert box.exec_command(["bash"], {"X": "1"}, pty=True) == [
        "docker",
        "exec",
        "-i",
        "-t",
        "-e",
        "TERM=xterm",
        "-w",
        "/workspace",
        "-e",
        "X=1",
        "rollserve-dock-2",
        "bash",
    ]
    assert box.exec_command(["true"], None, pty=False, interactive=False) == [
        "docker",
        "exec",
        "-w",
        "/workspace",
        "rollserve-dock-2",
        "true",
    ]


def working_engine() -> tuple[str, str] | str:
    """(engine, image) that can run a container here, else why not."""
    image = os.environ.get("ROLLSERVE_TEST_IMAGE", DockerConfig().default_image)
    reasons = []
    for engine in ("docker", "podman"):
        if shutil.which(engine) is None:
            reasons.append(f"{engine}: not on PATH")
            continue
        if reason := DockerRuntime.unavailable_reason(DockerConfig(runtime=engine)):
            reasons.append(reason)
            continue
        base = [engine, "--runtime", "runc"] if engine == "podman" else [engine]
        present = subprocess.run([*base, "image", "inspect", image], capture_output=True)
        if present.returncode != 0:
            reasons.append(f"{engine}: image {image} not present (tests pull nothing)")
            continue
        probe = subprocess.run(
            [*base, "run", "--rm", "--network", "none", image, "true"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode != 0:
            reasons.append(f"{engine}: cannot run a container: {probe.stderr.strip()[-200:]}")
            continue
        return engine, image
    return "; ".join(reasons)


async def test_real_container_exec_timeout_and_close(tmp_path):
    found = working_engine()
    if isinstance(found, str):
        pytest.skip(f"no working container engine here: {found}")
    engine, image = found
    runtime = DockerRuntime(tmp_path / "state", DockerConfig(runtime=engine))
    box = await runtime.start(SandboxSpec(image=image, files={"a.txt": "hi"}))
    try:
        result = await box.exec("cat a.txt; pwd", 60)
        assert result.stdout == "hi/workspace\n"
        timed = await box.exec("sleep 1000", 2)
        assert timed.timed_out
        left = await box.exec("ps -eo args 2>/dev/null | grep -c '^sleep 1000' || true", 30)
        assert left.stdout.strip() in ("0", "")
    finally:
        await box.close()
    gone = subprocess.run([engine, "container", "inspect", box.container], capture_output=True)
    assert gone.returncode != 0


def test_seed_copies_the_image_folder_before_the_container_mounts_the_workspace(tmp_path):
    runtime = DockerRuntime(tmp_path / "state", DockerConfig(runtime="podman"))
    folders = SandboxFolders.create(tmp_path, "dock-3")
    spec = SandboxSpec(
        image="swebench/sweb.eval.x86_64.x:latest", workspace_seed="/testbed", workspace_aliases=["/testbed"]
    )
    create, copy, remove = runtime.seed_commands(spec, "rollserve-dock-3", folders)
    assert create == [
        "podman",
        "--runtime",
        "runc",
        "create",
        "--name",
        "rollserve-dock-3-seed",
        "--label",
        "rollserve.sandbox=1",
        "swebench/sweb.eval.x86_64.x:latest",
        "true",
    ]
    assert copy == ["podman", "--runtime", "runc", "cp", "rollserve-dock-3-seed:/testbed/.", str(folders.workspace)]
    assert remove == ["podman", "--runtime", "runc", "rm", "-f", "rollserve-dock-3-seed"]
    run = " ".join(runtime.run_command(spec, "rollserve-dock-3", folders))
    assert f"-v {folders.workspace}:/workspace" in run and f"-v {folders.workspace}:/testbed" in run


FAKE_ENGINE = """#!/bin/sh
# A stand-in engine: logs each call; `cp CONTAINER:SRC DEST` copies from the fake image.
echo "$*" >> "$(dirname "$0")/calls.log"
if [ "$3" = "cp" ]; then src="${4#*:}"; exec cp -a "$(dirname "$0")/image$src" "$5"; fi
exit 0
"""


async def test_start_seeds_then_runs_and_reports_a_failed_seed(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    (bin_dir / "image" / "testbed").mkdir(parents=True)
    (bin_dir / "image" / "testbed" / "setup.py").write_text("# the image's repository\n")
    engine = bin_dir / "podman"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    engine_unavailable_reason.cache_clear()  # (an earlier test may have found no podman)
    runtime = DockerRuntime(tmp_path / "state", DockerConfig(runtime="podman"))
    spec = SandboxSpec(image="img:1", workspace_seed="/testbed", workspace_aliases=["/testbed"])
    box = await runtime.start(spec)
    try:
        assert (box.workspace / "setup.py").read_text() == "# the image's repository\n"
        calls = [
            line.split()[2]
            for line in (bin_dir / "calls.log").read_text().splitlines()
            if line.split()[:2] == ["--runtime", "runc"]
        ]
        assert calls[-4:] == ["create", "cp", "rm", "run"]
    finally:
        await box.close()
    bad = SandboxSpec(image="img:1", workspace_seed="/nowhere")
    with pytest.raises(SandboxError, match="could not seed the workspace"):
        await runtime.start(bad)
    assert not list((tmp_path / "state" / "sandboxes").glob("*.json"))
    engine_unavailable_reason.cache_clear()  # the fake engine is gone with this test

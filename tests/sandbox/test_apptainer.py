"""The apptainer runtime: command lines and the image cache, against a stand-in
``apptainer`` script (the real one cannot be installed here); the integration tests
at the end run only where a real apptainer/singularity is on PATH."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from rollserve.sandbox.apptainer import ApptainerConfig, ApptainerRuntime, cache_name
from rollserve.sandbox.base import SandboxError, SandboxLimits, SandboxSpec
from tests.waiting import eventually

# Records each call (argv, start and end time) in calls.jsonl next to it; `build` sleeps a little
# and writes the .sif; `exec` runs the command on the host in the --home workspace, with
# arguments that are paths inside mapped to the host folders bound there (or under
# the folder named in bin/image_root: the image's own files).
FAKE = """#!PYTHON
import json, os, subprocess, sys, time
args = sys.argv[1:]
started = time.time()
def log(**extra):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as f:
        f.write(json.dumps({"argv": args, "start": started, "end": time.time(), **extra}) + "\\n")
if args[0] == "build":
    time.sleep(float(os.environ.get("FAKE_BUILD_SECONDS", "0.2")))
    if "fail" in args[2]:
        log(); print("FATAL: no such image", file=sys.stderr); sys.exit(255)
    open(args[1], "w").write("SIF " + args[2])
    log(); sys.exit(0)
if args[0] == "exec":
    log(env={k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")})
    home = args[args.index("--home") + 1].split(":")[0]
    binds = dict(reversed(args[i + 1].split(":")[:2]) for i, a in enumerate(args) if a == "--bind")
    image = next(i for i, a in enumerate(args) if a.endswith(".sif"))
    # The image's own files (for paths not bound): a folder named in image_root next to this.
    marker = os.path.join(os.path.dirname(__file__), "image_root")
    root = open(marker).read() if os.path.exists(marker) else ""
    def host(arg):  # a path inside -> the host path it stands for
        if arg == "HOME=/tmp":
            return "HOME=" + binds["/tmp"]
        for inside, outside in [("/workspace", home), *binds.items()]:
            if arg == inside or arg.startswith(inside + "/"):
                return outside + arg[len(inside):]
        return root + arg if root and arg.startswith("/testbed") else arg
    inner = [host(a) for a in args[image + 1:]]
    os.chdir(home)
    os.execvp(inner[0], inner)
"""


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apptainer"
    script.write_text(FAKE.replace("PYTHON", sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = bin_dir / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def calls(kind: str | None = None) -> list[dict]:
        if not log.exists():
            return []
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        return [e for e in entries if kind is None or e["argv"][0] == kind]

    return calls


def test_unavailable_without_a_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "not on PATH" in ApptainerRuntime.unavailable_reason()


def test_cache_names_are_stable_and_distinct():
    a = cache_name("docker://python:3.12-slim")
    assert a == cache_name("docker://python:3.12-slim") and a.endswith(".sif")
    assert a.startswith("python_3.12-slim-")
    assert a != cache_name("docker://python:3.11-slim")


async def test_exec_command_line(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state", config=ApptainerConfig(fakeroot=True))
    async with await runtime.start(
        SandboxSpec(image="docker://debian:12", env={"A": "1,2"}, files={"x.txt": "hello"})
    ) as box:
        result = await box.exec("cat x.txt", 10)
        assert result.stdout == "hello"
        (call,) = fake_apptainer("exec")
        argv = call["argv"]
        assert argv[:4] == ["exec", "--containall", "--cleanenv", "--writable-tmpfs"]
        assert "--fakeroot" in argv
        assert argv[argv.index("--network") - 1 : argv.index("--network") + 2] == ["--net", "--network", "none"]
        assert argv[argv.index("--home") + 1] == f"{box.workspace}:/workspace"
        assert argv[argv.index("--bind") + 1] == f"{box.folders.tmp}:/tmp"
        # /dev/shm: a folder of the sandbox's (under the disk cap), not --contain's
        # unsized tmpfs.
        assert f"{box.folders.base / 'shm'}:/dev/shm" in argv
        assert (box.folders.base / "shm").stat().st_mode & 0o7777 == 0o1777
        assert argv[argv.index("--pwd") + 1] == "/workspace"
        assert argv[-6:] == [str(box.image), "env", "HOME=/tmp", "bash", "-c", "cat x.txt"]
        assert call["env"]["APPTAINERENV_A"] == "1,2"  # commas survive (unlike --env)
        shell = await box.spawn(["bash"], pty=True)
        await eventually(lambda: len(fake_apptainer("exec")) == 2, what="the stand-in to log the shell's exec")
        assert fake_apptainer("exec")[-1]["argv"][-6:] == ["env", "HOME=/tmp", "setsid", "--ctty", "--wait", "bash"]
        await shell.kill()


async def test_the_disk_cap_stops_a_command_that_fills_the_workspace(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state")
    fill = "for i in $(seq 300); do head -c 1048576 /dev/zero > f$i; sleep 0.02; done; echo fin''ished"
    spec = SandboxSpec(image="docker://debian:12", limits=SandboxLimits(disk_mb=8))
    async with await runtime.start(spec) as box:
        result = await box.exec(fill, 120)
    assert result.cap == "disk" and "finished" not in result.stdout
    assert "disk cap" in result.stderr


async def test_network_on_drops_network_none(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state")
    async with await runtime.start(SandboxSpec(image="docker://debian:12", network=True)) as box:
        await box.exec("true", 10)
    assert "--network" not in fake_apptainer("exec")[0]["argv"]
    assert "--fakeroot" not in fake_apptainer("exec")[0]["argv"]


async def test_one_build_per_reference_under_concurrency(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state")
    boxes = await asyncio.gather(*(runtime.start(SandboxSpec(image="docker://python:3.12")) for _ in range(5)))
    builds = fake_apptainer("build")
    assert len(builds) == 1
    target = Path(builds[0]["argv"][1])
    assert target.name.startswith(".") and target.name.endswith(".partial")  # then renamed
    assert {box.image for box in boxes} == {runtime.images.path_for("docker://python:3.12")}
    assert boxes[0].image.read_text() == "SIF docker://python:3.12"
    assert boxes[0].image.parent == tmp_path / "state" / "images"
    assert not list(boxes[0].image.parent.glob("*.partial"))
    await asyncio.gather(*(box.close() for box in boxes))
    # Cached: a later sandbox does not build again.
    async with await runtime.start(SandboxSpec(image="docker://python:3.12")):
        assert len(fake_apptainer("build")) == 1


async def test_concurrent_builds_are_capped(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state", config=ApptainerConfig(max_concurrent_builds=2))
    images = [f"docker://img{i}:latest" for i in range(5)]
    await asyncio.gather(*(runtime.images.ensure(ref) for ref in images))
    builds = fake_apptainer("build")
    assert len(builds) == 5
    overlap = max(sum(1 for b in builds if b["start"] <= t < b["end"]) for t in (b["start"] for b in builds))
    assert overlap <= 2


async def test_failed_build_is_a_sandbox_error_and_leaves_no_partial(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state")
    with pytest.raises(SandboxError, match="no such image"):
        await runtime.start(SandboxSpec(image="docker://fail:1"))
    assert not [p for p in (tmp_path / "state" / "images").iterdir() if p.suffix != ".lock"]


async def test_sif_files_are_used_as_they_are(fake_apptainer, tmp_path):
    sif = tmp_path / "my.sif"
    sif.write_text("SIF")
    runtime = ApptainerRuntime(tmp_path / "state")
    async with await runtime.start(SandboxSpec(image=str(sif))) as box:
        assert box.image == sif
    assert fake_apptainer("build") == []
    with pytest.raises(SandboxError, match="neither a file"):
        await runtime.start(SandboxSpec(image=str(tmp_path / "missing.sif")))


REAL = shutil.which("apptainer") or shutil.which("singularity")
real = pytest.mark.skipif(
    REAL is None,
    reason="apptainer/singularity is not on PATH here (it cannot be installed on this machine); runs where it is",
)


@real
async def test_real_apptainer_exec_and_isolation(tmp_path):
    image = os.environ.get("ROLLSERVE_TEST_SIF", "docker://debian:12-slim")
    runtime = ApptainerRuntime(tmp_path / "state")
    async with await runtime.start(SandboxSpec(image=image, files={"a.txt": "hi"})) as box:
        result = await box.exec("cat a.txt; pwd; echo x > /tmp/t; cat /tmp/t", 120)
        assert result.stdout == "hi/workspace\nx\n"
        assert (box.folders.tmp / "t").exists()
        timed = await box.exec("sleep infinity", 2)
        assert timed.timed_out


@real
async def test_real_apptainer_pty_shell(tmp_path):
    image = os.environ.get("ROLLSERVE_TEST_SIF", "docker://debian:12-slim")
    runtime = ApptainerRuntime(tmp_path / "state")
    async with await runtime.start(SandboxSpec(image=image)) as box:
        shell = await box.spawn(["bash", "--norc", "-i"], pty=True)
        await shell.write(b"echo $((6*7))\n")
        output = b""
        while b"42" not in output:
            output += await asyncio.wait_for(shell.read(), 60)
        await shell.kill()


async def test_a_spec_without_an_image_takes_the_default_image(fake_apptainer, tmp_path):
    runtime = ApptainerRuntime(tmp_path / "state", ApptainerConfig(default_image="docker://debian:12"))
    async with await runtime.start(SandboxSpec()) as box:
        assert box.image == runtime.images.path_for("docker://debian:12")
    assert [call["argv"][2] for call in fake_apptainer("build")] == ["docker://debian:12"]
    with pytest.raises(SandboxError, match="needs an image"):
        await ApptainerRuntime(tmp_path / "state").start(SandboxSpec())


async def test_hidden_paths_are_covered_by_an_empty_read_only_folder(fake_apptainer, tmp_path):
    # e.g. R2E's /r2e_tests: the image holds the hidden tests; the agent must not read them.
    runtime = ApptainerRuntime(tmp_path / "state")
    spec = SandboxSpec(image="docker://debian:12", hide=["/r2e_tests", "/opt/answers"])
    async with await runtime.start(spec) as box:
        await box.exec("true", 10)
        argv = fake_apptainer("exec")[0]["argv"]
        empty = box.folders.base / "empty"
        for path in ("/r2e_tests", "/opt/answers"):
            assert argv[argv.index(f"{empty}:{path}:ro") - 1] == "--bind"
        assert empty.is_dir() and not any(empty.iterdir())
        assert empty.stat().st_mode & 0o777 == 0o555
        assert argv.index(f"{empty}:/r2e_tests:ro") < argv.index(str(box.image))
    assert not box.folders.base.exists()

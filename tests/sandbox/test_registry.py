"""get_runtime: every name maps to a runtime, or to a clear reason why not here."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxError
from rollserve.sandbox.registry import RUNTIMES, availability, get_runtime


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

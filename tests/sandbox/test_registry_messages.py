"""When a runtime cannot run, its error says each reason once."""

import pytest

from rollserve.sandbox import registry
from rollserve.sandbox.base import SandboxError


def test_an_unavailable_runtime_names_each_reason_once(monkeypatch):
    reasons = {
        "bubblewrap": "bubblewrap: 'bwrap' is not on PATH (apt-get install bubblewrap)",
        "apptainer": "apptainer or singularity is not on PATH",
        "singularity": "apptainer or singularity is not on PATH",
        "docker": "no daemon",
        "podman": "podman is not on PATH",
        "local": None,
    }
    monkeypatch.setattr(registry, "unavailable_reason", lambda name, config=None: reasons.get(name))
    with pytest.raises(SandboxError) as caught:
        registry.get_runtime("bubblewrap")
    message = str(caught.value)
    for reason in set(filter(None, reasons.values())):
        assert message.count(reason) == 1, message
    assert "apptainer, singularity: apptainer or singularity is not on PATH" in message
    assert "Available here: local." in message

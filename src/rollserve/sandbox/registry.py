"""Runtimes by name: ``get_runtime("bubblewrap", state_dir)``."""

from __future__ import annotations

import importlib
from pathlib import Path

from rollserve.sandbox.base import Runtime, SandboxError

# name -> (module, class, keyword arguments). Imported lazily: a runtime's module
# is only loaded when it is asked for.
RUNTIMES: dict[str, tuple[str, str, dict]] = {
    "bubblewrap": ("rollserve.sandbox.bubblewrap", "BubblewrapRuntime", {}),
    # Both names: whichever of apptainer / singularity is on PATH.
    "apptainer": ("rollserve.sandbox.apptainer", "ApptainerRuntime", {}),
    "singularity": ("rollserve.sandbox.apptainer", "ApptainerRuntime", {}),
    "docker": ("rollserve.sandbox.docker", "DockerRuntime", {"engine": "docker"}),
    "podman": ("rollserve.sandbox.docker", "DockerRuntime", {"engine": "podman"}),
    "local": ("rollserve.sandbox.local", "LocalRuntime", {}),
}


def runtime_class(name: str) -> type[Runtime]:
    module, cls, _ = RUNTIMES[name]
    return getattr(importlib.import_module(module), cls)


def unavailable_reason(name: str) -> str | None:
    _, _, kwargs = RUNTIMES[name]
    cls = runtime_class(name)
    return cls.unavailable_reason(**kwargs) if kwargs else cls.unavailable_reason()


def availability() -> dict[str, str | None]:
    """Every runtime name -> None if it can run here, else why not."""
    return {name: unavailable_reason(name) for name in RUNTIMES}


def get_runtime(name: str, state_dir: Path | str | None = None, **config) -> Runtime:
    """The runtime ``name``, ready to start sandboxes whose owner records go under
    ``state_dir``; a SandboxError naming the usable ones if it cannot run here."""
    if name not in RUNTIMES:
        raise SandboxError(f"unknown sandbox runtime {name!r}; known: {', '.join(RUNTIMES)}. "
                           + _summary())
    reason = unavailable_reason(name)
    if reason is not None:
        raise SandboxError(f"sandbox runtime {name!r} cannot run here: {reason}. " + _summary())
    _, _, kwargs = RUNTIMES[name]
    return runtime_class(name)(state_dir=state_dir, **kwargs, **config)


def _summary() -> str:
    status = availability()
    usable = [name for name, reason in status.items() if reason is None]
    others = "; ".join(f"{name}: {reason}" for name, reason in status.items() if reason)
    return f"Available here: {', '.join(usable) or 'none'}. Not available: {others or 'none'}."

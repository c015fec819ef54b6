"""Runtimes by name: ``get_runtime("bubblewrap", state_dir)``; ``LazyRuntime`` for a
server, which creates its runtime on first use."""

from __future__ import annotations

import asyncio
import importlib
import logging
import typing
import weakref
from pathlib import Path

from pydantic import BaseModel, ValidationError

from rollserve.sandbox.base import Runtime, Sandbox, SandboxError, SandboxLimits, SandboxSpec
from rollserve.validation import describe

log = logging.getLogger(__name__)

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


def runtime_config(name: str, options: dict) -> BaseModel:
    """The runtime's own config model (``BubblewrapConfig``, ``ApptainerConfig``, ...)
    built from ``options``; a ValueError naming the bad option."""
    hints = typing.get_type_hints(runtime_class(name).__init__)
    models = [t for t in typing.get_args(hints.get("config")) if isinstance(t, type)
              and issubclass(t, BaseModel)]
    if not models:
        raise ValueError(f"sandbox runtime {name!r} takes no options")
    try:
        return models[0](**options)
    except ValidationError as error:
        raise ValueError(f"bad option for sandbox runtime {name!r} ({models[0].__name__}): "
                         f"{describe(error)}") from None


def get_runtime(name: str, state_dir: Path | str | None = None, **config) -> Runtime:
    """The runtime ``name``, ready to start sandboxes whose owner records go under
    ``state_dir``; a SandboxError naming the usable ones if it cannot run here."""
    if name not in RUNTIMES:
        raise SandboxError(f"unknown sandbox runtime {name!r}; known: {', '.join(RUNTIMES)}. "
                           + _summary())
    reason = unavailable_reason(name)
    if reason is not None:
        raise SandboxError(f"sandbox runtime {name!r} cannot run here: {reason}. "
                           + _summary(leave_out=name))
    _, _, kwargs = RUNTIMES[name]
    return runtime_class(name)(state_dir=state_dir, **kwargs, **config)


def _summary(leave_out: str | None = None) -> str:
    """Which runtimes can run here, and why the others cannot: each reason once (the
    runtimes sharing it named together), ``leave_out``'s own not repeated."""
    status = availability()
    usable = [name for name, reason in status.items() if reason is None]
    by_reason: dict[str, list[str]] = {}
    for name, reason in status.items():
        if reason and name != leave_out:
            by_reason.setdefault(reason, []).append(name)
    others = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())
    return f"Available here: {', '.join(usable) or 'none'}. Not available: {others or 'none'}."


class LazyRuntime:
    """A server's sandbox runtime, created on first use.

    A server whose runtime cannot run here (no bwrap, no docker daemon) still starts
    and serves the tasks that need no sandbox; a rollout that asks for one gets a
    ``SandboxError`` with the reason (an infrastructure failure: masked, never scored).
    It also keeps count of the sandboxes it started, for the status page, and can
    close any still open when the server stops.
    """

    def __init__(self, name: str, state_dir: Path | str | None = None,
                 options: dict | None = None):
        self.name = name
        self.state_dir = state_dir
        # Checked now (a ValueError at server start), used at first use.
        self.config = {"config": runtime_config(name, options)} if options else {}
        self.error: str | None = None  # why the runtime could not be created
        self.started = 0  # sandboxes started since the server started
        self._runtime: Runtime | None = None
        self._lock: asyncio.Lock | None = None
        self._open: weakref.WeakSet[Sandbox] = weakref.WeakSet()

    @property
    def runtime(self) -> Runtime | None:
        """The runtime, once created (None before the first sandbox, or if it failed)."""
        return self._runtime

    async def get(self) -> Runtime:
        """The runtime, created (in a thread: it may probe the host) on first call."""
        if self._runtime is not None:
            return self._runtime
        if self.error is not None:
            raise SandboxError(self.error)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._runtime is None and self.error is None:
                try:
                    self._runtime = await asyncio.to_thread(
                        get_runtime, self.name, self.state_dir, **self.config)
                except SandboxError as error:
                    self.error = str(error)
                    log.error("sandbox runtime %r unavailable: %s", self.name, error)
                except Exception as error:  # a runtime's own bug: still only this runtime's
                    self.error = f"sandbox runtime {self.name!r} failed to start: {error}"
                    log.exception("sandbox runtime %r failed to start", self.name)
        if self._runtime is None:
            raise SandboxError(self.error or f"sandbox runtime {self.name!r} is unavailable")
        return self._runtime

    async def start(self, spec: SandboxSpec) -> Sandbox:
        runtime = await self.get()
        sandbox = await runtime.start(spec)
        self.started += 1
        self._open.add(sandbox)
        return sandbox

    def open_sandboxes(self) -> list[Sandbox]:
        return [s for s in self._open if not getattr(s, "_closed", False)]

    async def aclose(self) -> None:
        """Close every sandbox still open (a safety net at server stop: rollouts close
        their own in cleanup)."""
        leftovers = self.open_sandboxes()
        if leftovers:
            log.warning("closing %d sandboxes still open at shutdown", len(leftovers))
        results = await asyncio.gather(*(s.close() for s in leftovers), return_exceptions=True)
        for sandbox, result in zip(leftovers, results):
            if isinstance(result, BaseException):
                log.error("could not close sandbox %s: %s", sandbox.id, result)

    def status(self) -> dict:
        return {
            "runtime": self.name,
            "ready": self._runtime is not None,
            "error": self.error,
            "open": len(self.open_sandboxes()),
            "started": self.started,
            "limits": self.limits(),
        }

    def limits(self) -> dict | None:
        """The default limits and how this runtime enforces each one (None until the
        runtime is created: the mechanism depends on the host it probes)."""
        if self._runtime is None:
            return None
        return {"defaults": SandboxLimits().model_dump(), "enforced_by": self._runtime.caps()}

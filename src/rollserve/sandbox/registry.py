"""The one registry of sandbox runtimes: ``get_runtime("bubblewrap", state_dir)``;
``LazyRuntime`` for a server, which creates its runtime on first use.

A runtime class is registered under each name its config model's ``runtime`` tag
takes (config.py): apptainer/singularity, docker/podman. A new runtime is one more
class in ``RUNTIME_CLASSES`` and one more model in the config union; the sandbox
contract tests then run on it (tests/sandbox/helpers.py).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from pathlib import Path
from typing import Any, TypeAlias

from rollserve.sandbox.apptainer import ApptainerRuntime
from rollserve.sandbox.base import (
    ImageRuntime,
    Runtime,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.config import RuntimeConfig, runtime_config
from rollserve.sandbox.docker import DockerRuntime
from rollserve.sandbox.local import LocalRuntime
from rollserve.sandbox.pool import SandboxPool

__all__ = [
    "RUNTIMES",
    "RUNTIME_CLASSES",
    "AnyRuntime",
    "LazyRuntime",
    "availability",
    "get_runtime",
    "image_runtimes",
    "new_runtime",
    "runtime_config",
    "unavailable_reason",
]

log = logging.getLogger(__name__)

# A runtime of any config (each class is a Runtime of its own config model; the
# registry holds them side by side).
AnyRuntime: TypeAlias = Runtime[Any]

RUNTIME_CLASSES: tuple[type[AnyRuntime], ...] = (BubblewrapRuntime, ApptainerRuntime, DockerRuntime, LocalRuntime)
RUNTIMES: dict[str, type[AnyRuntime]] = {name: cls for cls in RUNTIME_CLASSES for name in cls.config_model.names()}


def image_runtimes() -> list[str]:
    """The names of the runtimes that fetch images ahead of time (``rollserve images``)."""
    return [name for name, cls in RUNTIMES.items() if issubclass(cls, ImageRuntime)]


def new_runtime(config: RuntimeConfig, state_dir: Path | str | None = None) -> AnyRuntime:
    """The runtime ``config`` configures (whether it can run here or not)."""
    return RUNTIMES[config.runtime](state_dir, config)


def unavailable_reason(name: str, config: RuntimeConfig | None = None) -> str | None:
    """None if runtime ``name`` (so configured) can run here, else why not."""
    return RUNTIMES[name].unavailable_reason(config or runtime_config(name))


def availability() -> dict[str, str | None]:
    """Every runtime name -> None if it can run here, else why not."""
    return {name: unavailable_reason(name) for name in RUNTIMES}


def get_runtime(name: str, state_dir: Path | str | None = None, config: RuntimeConfig | None = None) -> AnyRuntime:
    """The runtime ``name``, ready to start sandboxes whose owner records go under
    ``state_dir``; a SandboxError naming the usable ones if it cannot run here."""
    if name not in RUNTIMES:
        raise SandboxError(f"unknown sandbox runtime {name!r}; known: {', '.join(RUNTIMES)}. " + _summary())
    config = config or runtime_config(name)
    if config.runtime != name:
        raise SandboxError(f"sandbox runtime {name!r} given the config of {config.runtime!r}")
    reason = unavailable_reason(name, config)
    if reason is not None:
        raise SandboxError(f"sandbox runtime {name!r} cannot run here: {reason}. " + _summary(leave_out=name))
    return new_runtime(config, state_dir)


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
    close any still open when the server stops. Its options are checked at once (a
    ValueError naming the bad option), the runtime made at first use.

    ``pool`` > 0: a warm pool of at most that many sandboxes (pool.py) that ``start``
    takes from first; a pooled sandbox counts as started and open once handed out.
    """

    def __init__(
        self, name: str, state_dir: Path | str | None = None, options: dict[str, Any] | None = None, *, pool: int = 0
    ) -> None:
        self.name = name
        self.state_dir = state_dir
        self.config: RuntimeConfig = runtime_config(name, options)
        self.error: str | None = None  # why the runtime could not be created
        self.started = 0  # sandboxes handed to rollouts since the server started
        self._runtime: AnyRuntime | None = None
        self._lock: asyncio.Lock | None = None
        self._open: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # handed to rollouts
        self._made: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # these and the pool's
        self.pool: SandboxPool | None = SandboxPool(self._make, pool) if pool else None

    @property
    def own_paths(self) -> bool:
        """Whether its sandboxes see paths of their own (``Runtime.own_paths``), known
        before the runtime is made."""
        return RUNTIMES[self.name].own_paths

    @property
    def runtime(self) -> AnyRuntime | None:
        """The runtime, once created (None before the first sandbox, or if it failed)."""
        return self._runtime

    async def get(self) -> AnyRuntime:
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
                    self._runtime = await asyncio.to_thread(get_runtime, self.name, self.state_dir, self.config)
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
        """A sandbox for ``spec``: a pooled one if one is ready, else started now."""
        runtime = await self.get()
        sandbox = await self.pool.acquire(spec) if self.pool is not None else None
        if sandbox is None:
            sandbox = await self._make(spec, runtime)
        self.started += 1
        self._open.add(sandbox)
        return sandbox

    async def _make(self, spec: SandboxSpec, runtime: AnyRuntime | None = None) -> Sandbox:
        sandbox = await (runtime or await self.get()).start(spec)
        self._made.add(sandbox)
        return sandbox

    def open_sandboxes(self) -> list[Sandbox]:
        return [sandbox for sandbox in self._open if not sandbox.closed]

    async def aclose(self) -> None:
        """Empty the pool, then close every sandbox still open (a safety net at server
        stop: rollouts close their own in cleanup)."""
        if self.pool is not None:
            await self.pool.aclose()
        leftovers = [sandbox for sandbox in self._made if not sandbox.closed]
        if leftovers:
            log.warning("closing %d sandboxes still open at shutdown", len(leftovers))
        results = await asyncio.gather(*(s.close() for s in leftovers), return_exceptions=True)
        for sandbox, result in zip(leftovers, results):
            if isinstance(result, BaseException):
                log.error("could not close sandbox %s: %s", sandbox.id, result)

    def status(self) -> dict[str, Any]:
        return {
            "runtime": self.name,
            "ready": self._runtime is not None,
            "error": self.error,
            "open": len(self.open_sandboxes()),
            "started": self.started,
            "limits": self.limits(),
            "pool": self.pool.status() if self.pool is not None else None,
        }

    def limits(self) -> dict[str, Any] | None:
        """The default limits and how this runtime enforces each one (None until the
        runtime is created: the mechanism depends on the host it probes)."""
        if self._runtime is None:
            return None
        return {"defaults": SandboxLimits().model_dump(), "enforced_by": self._runtime.caps()}

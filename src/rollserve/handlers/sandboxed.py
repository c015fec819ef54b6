"""What handlers that act in sandboxes share.

- ``open_sandbox``: start a sandbox for a rollout and remember it in the rollout's
  ``resources``, so ``close_sandboxes`` (called from the handler's ``cleanup``, which
  the engine always runs, even on cancel and timeout) closes it: no sandbox outlives
  its rollout. A start still under way when the rollout is cancelled is closed as
  soon as it completes. ``close_later`` adds tools (a shell, a kernel) closed first;
  ``close_tools`` closes those alone (a sandbox kept for a later stage).
- ``find_python`` / ``python_with``: an interpreter with IPython (the python tool) or
  another module (pytest, for SWE tests) inside a sandbox: the sandboxes' own Python
  where the runtime made one (``sandbox.python_prefix``), never the server's packages.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from rollserve.agent.base import Tool
from rollserve.handlers.base import HandlerContext, RolloutView
from rollserve.sandbox.base import Sandbox, SandboxError, SandboxSpec
from rollserve.sandbox.tools import IPythonConfig

log = logging.getLogger(__name__)

_PENDING: set[asyncio.Future[Any]] = set()  # starts that outlived a cancelled rollout


async def open_sandbox(ctx: HandlerContext, rollout: RolloutView, spec: SandboxSpec) -> Sandbox:
    """Start a sandbox for ``rollout``; ``close_sandboxes(rollout)`` closes it.

    Raises ``SandboxError`` (infra: masked) when the server has no usable runtime.
    """
    if ctx.sandboxes is None:
        raise SandboxError("this server has no sandbox runtime (HandlerContext.sandboxes is None)")
    start = asyncio.ensure_future(ctx.sandboxes.start(spec))
    try:
        # Shielded: a cancel must not abandon a sandbox half-way through its start.
        sandbox = await asyncio.shield(start)
    except asyncio.CancelledError:
        _PENDING.add(start)
        start.add_done_callback(_close_late)
        raise
    rollout.resources.sandboxes.append(sandbox)
    return sandbox


def _close_late(start: asyncio.Future[Sandbox]) -> None:
    """A sandbox whose rollout was cancelled while it started: close it now."""
    if start.cancelled() or start.exception() is not None:
        _PENDING.discard(start)
        return
    closing = asyncio.ensure_future(start.result().close())
    _PENDING.add(closing)
    closing.add_done_callback(_PENDING.discard)
    _PENDING.discard(start)


def close_later(rollout: RolloutView, *tools: Tool) -> None:
    """Tools (a shell, a kernel) to end before the rollout's sandboxes close."""
    rollout.resources.closers.extend(tools)


async def close_tools(rollout: RolloutView) -> None:
    """Close the rollout's tools (``close_later``), leaving its sandboxes open;
    idempotent, and never raises (problems are logged: closing the sandbox kills
    what a tool left)."""
    resources = rollout.resources
    tools, resources.closers = resources.closers, []
    for tool in tools:
        try:
            await tool.close()
        except Exception as error:
            log.debug("closing a tool of rollout %s: %s", rollout.id, error)


async def close_sandboxes(rollout: RolloutView) -> None:
    """Close the rollout's tools, then its sandboxes (which kills every process in
    them); idempotent, and never raises (problems are logged)."""
    await close_tools(rollout)
    resources = rollout.resources
    sandboxes, resources.sandboxes = resources.sandboxes, []
    results = await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    for sandbox, result in zip(sandboxes, results):
        if isinstance(result, BaseException):
            log.error("rollout %s: could not close sandbox %s: %r", rollout.id, sandbox.id, result)


# --- a python with a given module inside the sandbox ----------------------------------
_PYTHONS: dict[tuple[str, str | None, str | None, str, str | None], tuple[str, dict[str, str]]] = {}
# found, by (runtime, image, the runtime's sandbox python, module, the python asked for)


async def find_python(sandbox: Sandbox, base: IPythonConfig | None = None) -> IPythonConfig:
    """An ``IPythonConfig`` whose interpreter runs IPython inside ``sandbox``."""
    base = base or IPythonConfig()
    python, env = await python_with(sandbox, "IPython", base.python)
    return base.model_copy(update={"python": python, "env": {**base.env, **env}})


async def python_with(sandbox: Sandbox, module: str, first: str | None = None) -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) that imports ``module`` inside ``sandbox``.

    ``first`` if given (the operator's choice). Else the sandboxes' own Python that
    the runtime made (``sandbox.python_prefix``: bubblewrap over the host root; never
    the server's site-packages), or, where its interpreter is out of the sandbox's
    reach (a root server's pyenv under /root), a ``python3`` of the same version
    inside with its site-packages on PYTHONPATH. Else (an image) the image's
    ``python3``; on ``local`` (no isolation) this server's own. Found once per
    runtime, image and module; ``SandboxError`` if none.
    """
    key = (sandbox.runtime, sandbox.spec.image, sandbox.python_prefix, module, first)
    if key not in _PYTHONS:
        _PYTHONS[key] = await _probe_pythons(sandbox, _candidates(sandbox, module, first), module)
    return _PYTHONS[key]


def _candidates(sandbox: Sandbox, module: str, first: str | None) -> list[tuple[str, dict[str, str], str]]:
    """(python, environment, check) to try in turn."""
    imports = f"import {module}"
    if first:
        return [(first, {}, imports)]
    prefix = sandbox.python_prefix
    if prefix is None:
        image: list[tuple[str, dict[str, str], str]] = [("python3", {}, imports)]
        return [(sys.executable, {}, imports), *image] if sandbox.runtime == "local" else image
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    same_version = f"import sys, {module}; assert sys.version_info[:2] == {tuple(sys.version_info[:2])}"
    packages = {"PYTHONPATH": f"{prefix}/lib/python{version}/site-packages"}
    return [
        (f"{prefix}/bin/python", {}, imports),
        (f"python{version}", packages, same_version),
        ("python3", packages, same_version),
    ]


async def _probe_pythons(
    sandbox: Sandbox, candidates: list[tuple[str, dict[str, str], str]], module: str
) -> tuple[str, dict[str, str]]:
    tried = []
    for python, env, check in candidates:
        probe = await sandbox.exec([python, "-c", check], timeout=60, env=env)
        if probe.exit_code == 0:
            return python, env
        why = (probe.stderr or probe.stdout).strip().splitlines()
        tried.append(f"{python}: {why[-1][:200] if why else f'exit {probe.exit_code}'}")
    cause = f" ({sandbox.python_error})" if sandbox.python_error else ""
    raise SandboxError(
        f"no python with {module} runs inside the sandbox ("
        + "; ".join(tried)
        + f"); set the interpreter for this image{cause}"
    )

"""Sandboxes: where an agent's commands run (runtimes) and the tools that act in them.

``registry.get_runtime(name, state_dir)`` picks a runtime; base.py holds the contract
(Runtime, Sandbox, SandboxProcess, SandboxSpec), config.py the runtimes' configs.

The public face: the contract (imported here), and, imported on first use, what the
handlers take from the rest: ``BubblewrapConfig`` (config), ``View`` (bwrap_view: what
a bubblewrap sandbox sees of the host) and ``workspace_file_problem`` (workspace_files).
The tools that act inside a sandbox have their own face, ``sandbox.tools``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names
from rollserve.sandbox.base import (
    WORKDIR,
    ExecResult,
    ImageRuntime,
    Runtime,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxProcess,
    SandboxSpec,
    SandboxStarter,
    resolve_in_workspace,
)

if TYPE_CHECKING:
    from rollserve.sandbox.bwrap_view import View
    from rollserve.sandbox.config import BubblewrapConfig
    from rollserve.sandbox.workspace_files import workspace_file_problem

_HOMES: dict[str, str] = {
    "BubblewrapConfig": "rollserve.sandbox.config",
    "View": "rollserve.sandbox.bwrap_view",
    "workspace_file_problem": "rollserve.sandbox.workspace_files",
}

__all__ = [
    "WORKDIR",
    "BubblewrapConfig",
    "ExecResult",
    "ImageRuntime",
    "Runtime",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxSpec",
    "SandboxStarter",
    "View",
    "resolve_in_workspace",
    "workspace_file_problem",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

"""Sandboxes: where an agent's commands run (runtimes) and the tools that act in them.

``get_runtime(name, state_dir)`` picks a runtime; see base.py for the contract.
"""

from rollserve.sandbox.base import (WORKDIR, ExecResult, Runtime, Sandbox, SandboxError,
                                    SandboxLimits, SandboxProcess, SandboxSpec,
                                    resolve_in_workspace)

__all__ = ["WORKDIR", "ExecResult", "Runtime", "Sandbox", "SandboxError", "SandboxLimits",
           "SandboxProcess", "SandboxSpec", "resolve_in_workspace"]

"""Sandboxes: where an agent's commands run (runtimes) and the tools that act in them.

``registry.get_runtime(name, state_dir)`` picks a runtime; base.py holds the contract
(Runtime, Sandbox, SandboxProcess, SandboxSpec), config.py the runtimes' configs.
"""

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

__all__ = ["WORKDIR", "ExecResult", "ImageRuntime", "Runtime", "Sandbox", "SandboxError",
           "SandboxLimits", "SandboxProcess", "SandboxSpec", "SandboxStarter",
           "resolve_in_workspace"]

"""The multi-turn agent loop and the token-level trajectory."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollserve.agent.loop import LoopStats, run_agent_loop
    from rollserve.agent.sandbox_tools import BashTool, EditorTool, PythonTool
    from rollserve.agent.tool_env import ToolEnv, ToolEnvConfig
    from rollserve.agent.tools import FinishTool, ToolError, function_schema
    from rollserve.agent.trajectory import Trajectory

_HOMES: dict[str, str] = {
    **dict.fromkeys(("LoopStats", "run_agent_loop"), "rollserve.agent.loop"),
    **dict.fromkeys(("BashTool", "EditorTool", "PythonTool"), "rollserve.agent.sandbox_tools"),
    **dict.fromkeys(("ToolEnv", "ToolEnvConfig"), "rollserve.agent.tool_env"),
    **dict.fromkeys(("FinishTool", "ToolError", "function_schema"), "rollserve.agent.tools"),
    "Trajectory": "rollserve.agent.trajectory",
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "BashTool", "EditorTool", "FinishTool", "LoopStats", "PythonTool", "ToolEnv", "ToolEnvConfig",
    "ToolError", "Trajectory", "function_schema", "run_agent_loop",
]


def __getattr__(name: str) -> object:
    """Import a public name from its home module the first time it is asked for (so
    importing one module of this package does not import the others)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = vars(importlib.import_module(home))[name]
    globals()[name] = value
    return value

"""The multi-turn agent loop and the token-level trajectory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

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
    "BashTool",
    "EditorTool",
    "FinishTool",
    "LoopStats",
    "PythonTool",
    "ToolEnv",
    "ToolEnvConfig",
    "ToolError",
    "Trajectory",
    "function_schema",
    "run_agent_loop",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

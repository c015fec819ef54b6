"""Task families: one AgentHandler per data_source, and the registry.

The plugin API, importable from here in one place (each name is imported from its
home module on first use, so importing this package stays cheap: scoring workers
import ``handlers.latex`` and ``handlers.math.scoring`` without the agent stack)::

    from rollserve.handlers import AgentHandler, Evaluation, RolloutView, run_episode, ToolEnv

- the contract (``handlers.base``): ``AgentHandler``, ``HandlerDefaults``,
  ``HandlerContext``, ``Evaluation``, ``InvalidInstance``, ``RolloutView``,
  ``RolloutResources``;
- running an episode: ``run_episode``, and the agent's pieces it takes: ``AgentEnv``,
  ``Step``, ``ToolEnv``, ``ToolEnvConfig``, ``Tool``, ``FinishingTool``, ``FinishTool``,
  ``ToolError``, ``function_schema``, the sandbox tools ``BashTool``, ``EditorTool``,
  ``PythonTool``;
- sandboxes: ``open_sandbox``, ``close_later``, ``close_sandboxes``, ``find_python``,
  ``python_with``;
- scoring off the event loop: ``ScoringPool``, ``ScoringTimeout``, ``score_in_pool``;
- the registry (for the server and commands that build it): ``HandlerRegistry``,
  ``UnknownDataSource``;
- failures: ``InfraError`` (masked), ``AgentError`` (the agent's: reward 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "AgentHandler",
            "Evaluation",
            "HandlerContext",
            "HandlerDefaults",
            "InvalidInstance",
            "RolloutResources",
            "RolloutView",
        ),
        "rollserve.handlers.base",
    ),
    "run_episode": "rollserve.handlers.episode",
    **dict.fromkeys(
        ("close_later", "close_sandboxes", "find_python", "open_sandbox", "python_with"), "rollserve.handlers.sandboxed"
    ),
    **dict.fromkeys(("ScoringPool", "ScoringTimeout", "score_in_pool"), "rollserve.handlers.scoring"),
    **dict.fromkeys(("HandlerRegistry", "UnknownDataSource"), "rollserve.handlers.registry"),
    **dict.fromkeys(("AgentEnv", "FinishingTool", "Step", "Tool"), "rollserve.agent.base"),
    **dict.fromkeys(
        (
            "BashTool",
            "EditorTool",
            "FinishTool",
            "PythonTool",
            "ToolEnv",
            "ToolEnvConfig",
            "ToolError",
            "function_schema",
        ),
        "rollserve.agent",
    ),
    **dict.fromkeys(("AgentError", "InfraError"), "rollserve.errors"),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "AgentEnv",
    "AgentError",
    "AgentHandler",
    "BashTool",
    "EditorTool",
    "Evaluation",
    "FinishTool",
    "FinishingTool",
    "HandlerContext",
    "HandlerDefaults",
    "HandlerRegistry",
    "InfraError",
    "InvalidInstance",
    "PythonTool",
    "RolloutResources",
    "RolloutView",
    "ScoringPool",
    "ScoringTimeout",
    "Step",
    "Tool",
    "ToolEnv",
    "ToolEnvConfig",
    "ToolError",
    "UnknownDataSource",
    "close_later",
    "close_sandboxes",
    "find_python",
    "function_schema",
    "open_sandbox",
    "python_with",
    "run_episode",
    "score_in_pool",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())


if TYPE_CHECKING:
    from rollserve.agent import (
        BashTool,
        EditorTool,
        FinishTool,
        PythonTool,
        ToolEnv,
        ToolEnvConfig,
        ToolError,
        function_schema,
    )
    from rollserve.agent.base import AgentEnv, FinishingTool, Step, Tool
    from rollserve.errors import AgentError, InfraError
    from rollserve.handlers.base import (
        AgentHandler,
        Evaluation,
        HandlerContext,
        HandlerDefaults,
        InvalidInstance,
        RolloutResources,
        RolloutView,
    )
    from rollserve.handlers.episode import run_episode
    from rollserve.handlers.registry import HandlerRegistry, UnknownDataSource
    from rollserve.handlers.sandboxed import close_later, close_sandboxes, find_python, open_sandbox, python_with
    from rollserve.handlers.scoring import ScoringPool, ScoringTimeout, score_in_pool

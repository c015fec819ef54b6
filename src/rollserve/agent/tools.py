"""Tools an agent calls (``agent.base.Tool``): a JSON schema, and an async call that
answers with text.

A tool's failure is the agent's business, never a crash: bad arguments, a refused
edit, a command that timed out all come back as an error string the model reads and
can react to (and are counted). Only infrastructure failures (``InfraError``: the
sandbox died, the runtime broke) propagate, so the rollout is masked, not scored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rollserve.agent.base import FinishingTool, Tool
from rollserve.errors import InfraError

__all__ = [
    "FinishTool",
    "FinishingTool",
    "Tool",
    "ToolError",
    "ToolOutcome",
    "call_tool",
    "check_arguments",
    "function_schema",
]

log = logging.getLogger(__name__)


class ToolError(Exception):
    """A tool refused or failed a call; the message is shown to the model."""


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A tool schema in the shape chat templates and OpenAI-style APIs expect."""
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


# --- argument checking ------------------------------------------------------------
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def check_arguments(schema: dict[str, Any], args: Any) -> None:
    """Raise ToolError naming the argument at fault.

    Covers what models get wrong in practice (missing, unknown, wrong type, not in
    enum) without a JSON-schema dependency; nested schemas are not descended into.
    """
    name = schema["name"]
    if not isinstance(args, dict):
        raise ToolError(f"{name}: arguments must be a JSON object, got {type(args).__name__}")
    params = schema.get("parameters") or {}
    properties: dict[str, Any] = params.get("properties") or {}
    missing = [key for key in params.get("required", []) if key not in args]
    if missing:
        raise ToolError(f"{name}: missing required argument(s): {', '.join(missing)}")
    unknown = [key for key in args if key not in properties]
    if unknown and params.get("additionalProperties", False) is False:
        raise ToolError(
            f"{name}: unknown argument(s): {', '.join(unknown)} (accepted: {', '.join(properties) or 'none'})"
        )
    for key, value in args.items():
        spec = properties.get(key) or {}
        types = spec.get("type")
        if types is None:
            continue
        allowed = [types] if isinstance(types, str) else list(types)
        if value is None and "null" in allowed:
            continue
        ok = any(
            isinstance(value, _JSON_TYPES.get(t, object))
            and not (t in ("integer", "number") and isinstance(value, bool))
            for t in allowed
        )
        if not ok:
            raise ToolError(f"{name}: argument {key!r} must be {' or '.join(allowed)}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"{name}: argument {key!r} must be one of {spec['enum']}, got {value!r}")


# --- calling -----------------------------------------------------------------------
@dataclass
class ToolOutcome:
    text: str  # what the model reads
    error: bool = False
    timed_out: bool = False
    seconds: float = 0.0


async def call_tool(tool: Tool, args: Any, timeout: float) -> ToolOutcome:
    """Check ``args``, run ``tool`` bounded by ``timeout``, and turn every agent-side
    failure into an error text. ``InfraError`` (and cancellation) propagate."""
    started = time.perf_counter()
    name = tool.name
    try:
        check_arguments(tool.schema, args)
        async with asyncio.timeout(timeout):
            text = await tool(args)
        return ToolOutcome(text=text, seconds=time.perf_counter() - started)
    except InfraError:
        raise
    except TimeoutError:
        return ToolOutcome(
            text=f"Error: {name} did not finish within {timeout:g} s and was stopped.",
            error=True,
            timed_out=True,
            seconds=time.perf_counter() - started,
        )
    except ToolError as exc:
        text = f"Error: {exc}"
    except Exception as exc:  # a tool bug must not crash the rollout; log it for us
        log.exception("tool %s failed", name)
        text = f"Error: {name} failed: {type(exc).__name__}: {exc}"
    return ToolOutcome(text=text, error=True, seconds=time.perf_counter() - started)


# --- finish / submit --------------------------------------------------------------------
class FinishTool(FinishingTool):
    """Ends the episode with the agent's answer.

    ``collect`` (optional) computes what is submitted instead of taking it from the
    arguments, e.g. ``git diff`` of the workspace for a patch-producing task.
    """

    def __init__(
        self,
        name: str = "finish",
        description: str = "Call when you are done, with your final answer. This ends the task.",
        parameter: str | None = "answer",
        parameter_description: str = "your final answer",
        collect: Callable[[dict[str, Any]], Awaitable[str]] | None = None,
    ) -> None:
        properties = {parameter: {"type": "string", "description": parameter_description}} if parameter else {}
        self.schema = function_schema(name, description, properties, [parameter] if parameter else [])
        self.parameter = parameter
        self.collect = collect
        self.finished = False
        self.answer: str | None = None

    async def __call__(self, args: dict[str, Any]) -> str:
        if self.collect is not None:
            self.answer = await self.collect(args)
        else:
            self.answer = str(args.get(self.parameter, "")) if self.parameter else ""
        self.finished = True
        return "Submitted. The episode is over."

    def submission(self, output: str) -> dict[str, Any]:
        return {self.parameter: output} if self.parameter else {}

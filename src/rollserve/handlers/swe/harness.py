"""The swe family's ``harness`` option: an agent harness rollserve did not write runs
the episode inside the rollout's sandbox, its model calls going through the recording
gateway (``handlers.harness``), instead of rollserve's own tool loop.

Instance field (per task, so one server trains several harnesses)::

    "harness": {"preset": "mini-swe-agent", "config": ["swebench.yaml"]}
    "harness": {"preset": "command", "command": "<bash -c command>"}

- ``mini-swe-agent``: mini-swe-agent (2.4.x, ``pip install rollserve[harness]``),
  unmodified, run as ``python -m minisweagent.run.mini`` on the python the forwarder
  runs on. Its configuration is ``config`` (mini-swe-agent config specs, builtin file
  names or ``key=value``; default ``swebench.yaml``, the one its SWE-bench runs use),
  then rollserve's settings (``MINI_SETTINGS``, a file in ``.git/`` of the workspace,
  never in a diff): the task is the issue text, the agent ``default`` (no prompts),
  the environment ``local`` (commands run by ``bash -c`` in the sandbox, in
  ``/workspace``), the model ``openai/<name>`` through litellm at
  ``OPENAI_BASE_URL`` (the forwarder), cost tracking ``ignore_errors`` (the policy
  is not a priced model), no cost limit, and ``step_limit`` the rollout's
  ``max_turns``.
- ``command``: ``bash -c <command>`` in the workspace; the issue text is in
  ``$ROLLSERVE_PROBLEM_FILE``.

Either way the harness gets ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (``handlers.harness``)
and the agent's environment (host mode: ``python``/``pytest`` shims). The episode ends
when it exits, at ``max_turns`` or at the time limit; then EVAL grades the workspace's
diff as for the tool loop.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollserve.contract.validation import field_name
from rollserve.handlers.base import HandlerContext, InvalidInstance, RolloutView
from rollserve.handlers.harness import HarnessOutput, gateway_session, run_in_sandbox
from rollserve.handlers.sandboxed import python_with
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

__all__ = ["HarnessSpec", "parse_harness", "run_harness"]

MINI_SETTINGS = ".git/rollserve-mini-swe-agent.yaml"  # JSON (YAML reads it); never in a diff
PROBLEM_FILE = ".git/rollserve-problem.md"
MINI_TRAJECTORY = "/tmp/.rollserve-mini-swe-agent.traj.json"  # the sandbox's private /tmp


class HarnessSpec(BaseModel):
    """``instance.harness``."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["mini-swe-agent", "command"]
    command: str | None = Field(None, min_length=1, description="preset command: the harness, "
                                "run with bash -c in the workspace")
    config: list[str] = Field(default_factory=lambda: ["swebench.yaml"], min_length=1,
                              description="preset mini-swe-agent: its config specs (builtin "
                              "file names or key=value), before rollserve's settings")
    model_name: str = Field("openai/rollserve-policy", pattern=r"^openai/\S+$",
                            description="preset mini-swe-agent: the litellm model name")
    tool_calls: Literal["hermes", "none"] = Field(
        "hermes", description="hermes: the policy's <tool_call> blocks answered as OpenAI "
        "tool_calls when the harness offers tools; none: every reply is text")

    @model_validator(mode="after")
    def _command_for_its_preset(self) -> HarnessSpec:
        if self.preset == "command" and self.command is None:
            raise ValueError("preset 'command' needs a command")
        if self.preset != "command" and self.command is not None:
            raise ValueError(f"preset {self.preset!r} builds its own command; leave command out")
        return self


def parse_harness(instance: Mapping[str, Any]) -> HarnessSpec | None:
    """``instance.harness`` (None without one); InvalidInstance naming the field."""
    raw = instance.get("harness")
    if raw is None:
        return None
    try:
        spec = HarnessSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInstance(field_name(("instance", "harness", *first["loc"])),
                              first["msg"]) from None
    if spec.preset == "mini-swe-agent" and importlib.util.find_spec("minisweagent") is None:
        raise InvalidInstance("instance.harness.preset", "mini-swe-agent is not installed on "
                              "this server: pip install 'rollserve[harness]'")
    return spec


def mini_settings(task: SWETask, spec: HarnessSpec, max_turns: int, images: bool) -> dict[str, Any]:
    """rollserve's part of mini-swe-agent's configuration (merged after ``spec.config``)."""
    environment: dict[str, Any] = {"environment_class": "local", "cwd": "/workspace"}
    if not images:  # swebench.yaml's BASH_ENV is the image's conda set-up, not the host's
        environment["env"] = {"BASH_ENV": ""}
    return {
        "run": {"task": task.problem_statement},
        "agent": {"agent_class": "default", "step_limit": max_turns, "cost_limit": 0,
                  "output_path": MINI_TRAJECTORY},
        "environment": environment,
        "model": {"model_class": "litellm", "model_name": spec.model_name,
                  "cost_tracking": "ignore_errors"},
    }


def mini_command(spec: HarnessSpec) -> str:
    configs = " ".join(f"-c {shlex.quote(c)}" for c in spec.config)
    return (f'exec "$ROLLSERVE_PYTHON" -m minisweagent.run.mini --exit-immediately {configs} '
            f"-c /workspace/{MINI_SETTINGS} -o {MINI_TRAJECTORY}")


MINI_ENV = {
    "MSWEA_CONFIGURED": "true",  # no first-run set-up prompt
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download at import (no network anyway)
    "PYTHONUNBUFFERED": "1",
}


async def run_harness(ctx: HandlerContext, rollout: RolloutView, sandbox: Sandbox, task: SWETask,
                      spec: HarnessSpec, agent_env: dict[str, str], images: bool) -> HarnessOutput:
    """The episode: ``spec``'s harness in ``sandbox`` behind the rollout's gateway
    session, until it exits, ``max_turns`` or the time limit. ``agent_env``: the
    environment the agent's commands need (host mode's python shims)."""
    await sandbox.write_file(PROBLEM_FILE, task.problem_statement)
    env = {**agent_env, "ROLLSERVE_PROBLEM_FILE": f"/workspace/{PROBLEM_FILE}"}
    if spec.preset == "mini-swe-agent":
        settings = mini_settings(task, spec, rollout.max_turns, images)
        await sandbox.write_file(MINI_SETTINGS, json.dumps(settings))
        python, extra = await python_with(sandbox, "minisweagent")
        command = mini_command(spec)
        env.update(MINI_ENV)
    else:
        assert spec.command is not None
        python, extra = await python_with(sandbox, "asyncio")
        command = spec.command
    output = HarnessOutput()
    async with gateway_session(ctx, rollout, parse_tool_calls=spec.tool_calls == "hermes") \
            as (session, key):
        try:
            await run_in_sandbox(sandbox, session, key, command, python, {**extra, **env}, output)
        finally:
            if output.exit_code is not None:
                rollout.add_stats({"harness_exit_code": output.exit_code})
    return output

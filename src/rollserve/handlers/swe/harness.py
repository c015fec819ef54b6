"""The swe family's ``harness`` option: an agent harness rollserve did not write runs
the episode inside the rollout's sandbox, its model calls going through the recording
gateway, instead of rollserve's own tool loop.

Instance field (per task, so one server trains several harnesses), a preset
(``agent/harnesses/presets/<name>.toml``, checked by ``handlers.presets``)::

    "harness": {"preset": "mini-swe-agent", "config": ["swebench.yaml"]}
    "harness": {"preset": "codex"}
    "harness": {"preset": "command", "command": "<bash -c command>"}

The issue text is in ``$ROLLSERVE_TASK_FILE`` (also ``$ROLLSERVE_PROBLEM_FILE``: a
file in ``.git/`` of the workspace, never in a diff); ``$ROLLSERVE_SANDBOX_IMAGE`` is
the instance's image (empty on the host view). The harness gets the agent's
environment too (host mode: ``python``/``pytest`` shims). The episode ends when it
exits, at ``max_turns`` or at the time limit; then EVAL grades the workspace's diff
as for the tool loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollserve.handlers.base import HandlerContext, RolloutView
from rollserve.handlers.harness import HarnessOutput
from rollserve.handlers.presets import HarnessSpec, parse_harness, run_preset
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import WORKDIR, Sandbox

__all__ = ["HarnessSpec", "instance_harness", "run_harness"]

PROBLEM_FILE = ".git/rollserve-problem.md"


def instance_harness(ctx: HandlerContext, instance: Mapping[str, Any]) -> HarnessSpec | None:
    """``instance.harness`` checked (None without one); InvalidInstance naming the field."""
    raw = instance.get("harness")
    return None if raw is None else parse_harness(ctx, raw)


async def run_harness(
    ctx: HandlerContext,
    rollout: RolloutView,
    sandbox: Sandbox,
    task: SWETask,
    spec: HarnessSpec,
    agent_env: dict[str, str],
    image: str | None,
) -> HarnessOutput:
    """The episode: ``spec``'s harness in ``sandbox`` behind the rollout's gateway
    session. ``agent_env``: the environment the agent's commands need."""
    await sandbox.write_file(PROBLEM_FILE, task.problem_statement)
    problem = f"{WORKDIR}/{PROBLEM_FILE}"
    env = {**agent_env, "ROLLSERVE_PROBLEM_FILE": problem, "ROLLSERVE_SANDBOX_IMAGE": image or ""}
    return await run_preset(ctx, rollout, sandbox, spec, env, task_file=problem)

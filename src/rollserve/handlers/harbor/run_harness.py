"""``instance.harness`` for a Harbor task: the swe family's harness field (its
``HarnessSpec``, parsed by ``swe.harness.parse_harness``), run in the task's sandbox
behind the rollout's gateway session, in the task's workdir. The task's instruction
is in ``$ROLLSERVE_PROBLEM_FILE`` (in the sandbox's private /tmp, never in the workdir
the verifier reads); mini-swe-agent gets it as its task, its settings in /tmp too."""

from __future__ import annotations

import json
import shlex
from typing import Any, cast

from rollserve.handlers.base import HandlerContext, RolloutView
from rollserve.handlers.harness import HarnessOutput, gateway_session, run_in_sandbox
from rollserve.handlers.sandboxed import python_with
from rollserve.handlers.swe.harness import MINI_ENV, HarnessSpec, mini_settings
from rollserve.sandbox.base import Sandbox

PROBLEM = "/tmp/.rollserve-task.md"
SETTINGS = "/tmp/.rollserve-mini-swe-agent.yaml"  # JSON, which YAML reads
TRAJECTORY = "/tmp/.rollserve-mini-swe-agent.traj.json"


class _Task:
    """What ``mini_settings`` reads of a task."""

    def __init__(self, text: str) -> None:
        self.problem_statement = text


async def run_task_harness(ctx: HandlerContext, rollout: Any, sandbox: Sandbox, spec: HarnessSpec,
                           instruction: str, workdir: str, env: dict[str, str]) -> HarnessOutput:
    view = cast(RolloutView, rollout)
    await _write(sandbox, PROBLEM, instruction)
    run_env = {**env, "ROLLSERVE_PROBLEM_FILE": PROBLEM}
    if spec.preset == "mini-swe-agent":
        settings = mini_settings(cast(Any, _Task(instruction)), spec, view.max_turns, images=False)
        settings["environment"]["cwd"] = workdir
        settings["agent"]["output_path"] = TRAJECTORY
        await _write(sandbox, SETTINGS, json.dumps(settings))
        python, extra = await python_with(sandbox, "minisweagent")
        configs = " ".join(f"-c {shlex.quote(c)}" for c in spec.config)
        command = (f'exec "$ROLLSERVE_PYTHON" -m minisweagent.run.mini --exit-immediately '
                   f"{configs} -c {SETTINGS} -o {TRAJECTORY}")
        run_env.update(MINI_ENV)
    else:
        assert spec.command is not None
        python, extra = await python_with(sandbox, "asyncio")
        command = spec.command
    command = f"cd {shlex.quote(workdir)} && {command}"
    output = HarnessOutput()
    async with gateway_session(ctx, view, parse_tool_calls=spec.tool_calls == "hermes") \
            as (session, key):
        try:
            await run_in_sandbox(sandbox, session, key, command, python, {**extra, **run_env},
                                 output)
        finally:
            if output.exit_code is not None:
                view.add_stats({"harness_exit_code": output.exit_code})
    return output


async def _write(sandbox: Sandbox, path: str, text: str) -> None:
    made = await sandbox.exec(f"cat > {path}", timeout=30, stdin=text.encode())
    if not made.ok:
        from rollserve.errors import InfraError

        raise InfraError(f"could not write {path} in the sandbox: {made.failure()}")

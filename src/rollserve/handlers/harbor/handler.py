"""The ``harbor`` family: a Harbor-format task folder (Terminal-Bench 2.0 and friends).

INIT starts the rollout's sandbox with the task's environment (see ``environment``):
its workdir is the sandbox's workspace, ``/tests`` and ``/logs`` are folders of the
sandbox's own, empty while the agent runs, and the task folder itself is hidden.
RUN is rollserve's tool loop (bash, finish) on ``instruction.md``, or an agent harness
(``instance.harness``, as the swe family takes it), bounded by ``[agent].timeout_sec``;
the operator's oracle check runs ``solution/solve.sh`` instead (copied to
``/solution`` for it alone), or nothing (``none``). EVAL is Harbor's verifier (see
``verifier``). Instance: ``{"task": "<folder under the server's harbor root>",
"agent": "tools", "harness": {...}}`` (see ``instances``).
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import ValidationError

from rollserve.agent import BashTool, FinishTool, ToolEnv, ToolEnvConfig
from rollserve.contract.validation import field_name
from rollserve.errors import InfraError
from rollserve.handlers.base import (
    AgentHandler,
    Evaluation,
    FirstPrompt,
    HandlerContext,
    HandlerDefaults,
    InvalidInstance,
    RolloutView,
)
from rollserve.handlers.episode import run_episode
from rollserve.handlers.harbor import environment as envs
from rollserve.handlers.harbor.bounded import Bounded
from rollserve.handlers.harbor.config import refusals
from rollserve.handlers.harbor.folder import HarborTask, TaskProblem, load_task_cached, tar_of
from rollserve.handlers.harbor.instances import HarborInstance, HarborOptions, resolve_task
from rollserve.handlers.harbor.verifier import verify
from rollserve.handlers.harness import HarnessOutput
from rollserve.handlers.presets import (
    HarnessSpec,
    harness_first_prompt,
    parse_harness,
    run_preset,
    task_size_problem,
)
from rollserve.handlers.sandboxed import close_later, close_sandboxes, close_tools
from rollserve.llm.routing import current_deadline
from rollserve.sandbox.base import Sandbox
from rollserve.sandbox.tools import DEFAULT_ENV, BashConfig
from rollserve.validation import describe

SYSTEM_PROMPT = (
    "You are an expert at the Linux command line. Solve the task in the terminal "
    "with the bash tool; call finish when it is done. Nobody will answer questions."
)
ORACLE_LOG = "/logs/agent/oracle.txt"
EVAL_MARGIN = 30.0  # seconds kept after the tests for reading the reward and closing (at
# most half of what EVAL has left when the verifier starts)


@dataclass
class HarborWork:
    """INIT -> RUN -> EVAL: the task, its sandbox and environment, what RUN left."""

    task: HarborTask
    mode: str
    sandbox: Sandbox
    workdir: str
    env: dict[str, str]
    offline: bool  # the task asked for the network and runs without it
    details: dict[str, Any] = field(default_factory=dict)
    harness_spec: HarnessSpec | None = None  # instance.harness, checked
    harness: HarnessOutput | None = None


class HarborHandler(AgentHandler):
    name = "harbor"
    defaults = HandlerDefaults(
        max_turns=40,
        max_context_tokens=32768,
        init_timeout=900.0,
        run_timeout=3600.0,
        eval_timeout=1200.0,
        total_timeout=5400.0,
    )
    bash = BashConfig(timeout=180.0, idle_timeout=120.0)
    max_command_seconds = 600.0

    def __init__(self, ctx: HandlerContext) -> None:
        super().__init__(ctx)
        try:
            self.options = HarborOptions(**ctx.options.get(self.name, {}))
        except ValidationError as error:
            known = ", ".join(HarborOptions.model_fields)
            raise ValueError(f"harbor handler options: {describe(error)} (known: {known})") from None

    @property
    def runtime(self) -> str | None:
        return self.ctx.sandboxes.name if self.ctx.sandboxes is not None else None

    # --- validation ---------------------------------------------------------------------
    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        return self.task(instance)[1].instruction or None

    def validate(self, instance: Mapping[str, Any]) -> None:
        self.task(instance)

    def task(self, instance: Mapping[str, Any]) -> tuple[HarborInstance, HarborTask]:
        """The instance and its task, as this server can run them; InvalidInstance naming
        the field (``instance.task`` with the file or task.toml field at fault, or
        ``instance.harness``: a preset not installed here...) otherwise."""
        try:
            spec = HarborInstance.model_validate(instance)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidInstance(field_name(("instance", *first["loc"])), first["msg"]) from None
        if spec.agent != "tools" and not self.options.operator_modes:
            raise InvalidInstance(
                "instance.agent",
                f"{spec.agent!r} is the operator's check (rollserve datasets oracle), not available on this server",
            )
        if spec.harness is not None and spec.agent != "tools":
            raise InvalidInstance("instance.harness", "only with agent 'tools'")
        harness = parse_harness(self.ctx, spec.harness) if spec.harness is not None else None
        folder = resolve_task(self.options.root, spec.task)
        try:
            task = load_task_cached(folder)  # (submit calls this on the event loop)
            self._check(task, spec)
            too_long = task_size_problem(harness, task.instruction)
            if too_long is not None:
                raise TaskProblem("instruction.md", too_long)
        except TaskProblem as problem:
            raise InvalidInstance("instance.task", f"{spec.task}: {problem}") from None
        return spec, task

    def _check(self, task: HarborTask, spec: HarborInstance) -> None:
        runtime = self.runtime
        images = envs.uses_images(runtime)
        found = refusals(
            task.config, images=images, cpus=os.cpu_count() or 1, host_images=tuple(self.options.host_images)
        )
        if found is not None:
            raise TaskProblem(f"task.toml: {found[0]}", found[1])
        env, options = task.config.environment, self.options
        if env.public and options.network == "refuse":
            raise TaskProblem(
                "task.toml: environment.network_mode",
                "the task asks for the network; this server refuses such tasks (its sandboxes have none)",
            )
        for name, value, most in (
            ("environment.memory_mb", env.memory_mb, options.max_memory_mb),
            ("environment.storage_mb", env.storage_mb, options.max_storage_mb),
            ("verifier.timeout_sec", task.config.verifier.timeout_sec, options.max_verifier_seconds),
            ("agent.timeout_sec", task.config.agent.timeout_sec, options.max_agent_seconds),
        ):
            if value is not None and value > most:
                raise TaskProblem(f"task.toml: {name}", f"{value:g} is over this server's {most:g}")
        if spec.agent == "oracle" and not task.has_solution:
            raise TaskProblem("solution/solve.sh", "missing (the oracle runs it)")
        envs.check_runtime(task, runtime)

    def first_prompt(self, instance: Mapping[str, Any]) -> FirstPrompt | None:
        return harness_first_prompt(self.ctx, instance.get("harness"))

    def images(self, instance: Mapping[str, Any]) -> list[str]:
        image = self.task(instance)[1].config.environment.docker_image
        return [image] if image else []

    # --- the stages -------------------------------------------------------------------------
    async def init(self, rollout: RolloutView) -> None:
        spec, task = await asyncio.to_thread(self.task, rollout.instance)
        hidden = [self.options.root]
        harness = parse_harness(self.ctx, spec.harness) if spec.harness is not None else None
        layout = await envs.open_environment(
            self.ctx, rollout, task, oracle=spec.agent == "oracle", hidden=hidden, harness=harness
        )
        work = HarborWork(
            task,
            spec.agent,
            layout.sandbox,
            layout.workdir,
            layout.env,
            offline=task.config.environment.public,
            harness_spec=harness,
        )
        if work.offline:
            work.details["network"] = (
                f"none: the task asks for the network ({task.config.environment.network_mode}); it ran without"
            )
        rollout.state = work
        await envs.healthcheck(layout.sandbox, task, layout.workdir, layout.env)

    async def run(self, rollout: RolloutView) -> None:
        work = self.state(rollout, HarborWork)
        bounded = Bounded(rollout, work.task.config.agent.timeout_sec)
        if work.mode == "oracle":
            await self._oracle(work, bounded)
        elif work.mode == "tools":
            if work.harness_spec is not None:  # the task's text outside the workdir
                work.harness = await run_preset(
                    self.ctx,
                    cast(RolloutView, bounded),
                    work.sandbox,
                    work.harness_spec,
                    work.env,
                    task=work.task.instruction,
                    workdir=work.workdir,
                )
            else:
                await self._tool_episode(bounded, work)
        # Nothing of the agent may run on into EVAL: its shells end here (on bubblewrap
        # every process they started dies with them); the sandbox stays open for EVAL.
        await close_tools(rollout)

    async def _tool_episode(self, rollout: Bounded, work: HarborWork) -> None:
        config = self.bash.model_copy(update={"cwd": work.workdir, "env": {**DEFAULT_ENV, **work.env}})
        bash = BashTool(work.sandbox, config, max_timeout=self.max_command_seconds)
        close_later(cast(RolloutView, rollout), bash)
        finish = FinishTool(description="Call when the task is done. This ends the task.", parameter=None)
        env = ToolEnv(
            [bash, finish],
            work.task.instruction,
            SYSTEM_PROMPT,
            tokenizer=self.ctx.tokenizer,
            config=ToolEnvConfig(call_timeout=self.max_command_seconds + 60.0),
        )
        await run_episode(self.ctx, cast(RolloutView, rollout), env)
        work.details["finished"] = finish.finished

    async def _oracle(self, work: HarborWork, rollout: Bounded) -> None:
        """solution/solve.sh in place of the agent, as Harbor's oracle runs it."""
        solution = await asyncio.to_thread(tar_of, [(work.task.folder / "solution", ".")])
        copied = await work.sandbox.exec("tar -x --no-same-owner -C /solution -f -", timeout=120, stdin=solution)
        if not copied.ok:  # the server's failure, not the oracle's: masked, never scored
            raise InfraError(f"could not copy solution/ into the sandbox: {copied.failure()}")
        timeout = rollout.seconds_left(self.defaults.run_timeout)
        ran = await work.sandbox.exec(
            f"cd {shlex.quote(work.workdir)} && bash /solution/solve.sh > {ORACLE_LOG} 2>&1",
            timeout=timeout,
            env={**work.env, **work.task.config.solution.env},
        )
        log = await work.sandbox.exec(f"tail -c 2000 {ORACLE_LOG}", timeout=30)
        work.details.update(
            oracle_exit_code=ran.exit_code, oracle_timed_out=ran.timed_out, oracle_output_tail=log.stdout
        )

    async def eval(self, rollout: RolloutView) -> Evaluation:
        work = self.state(rollout, HarborWork)
        # A hang is scored before the EVAL stage's limit (timeouts.eval) or the rollout's
        # deadline masks it: the engine bounds the stage's calls by the earlier of the two.
        ends = [w for w in (rollout.deadline, current_deadline()) if w is not None]
        verdict = await verify(
            work.sandbox,
            work.task,
            work.workdir,
            work.env,
            work.task.config.verifier.timeout_sec,
            end=min(ends) if ends else None,
            margin=EVAL_MARGIN,
            shared_pids=envs.uses_images(self.runtime),
        )
        details = {"task": work.task.name, "agent": work.mode, **work.details, **verdict.details}
        if work.harness is not None:
            details.update(harness_exit_code=work.harness.exit_code, harness_log_tail=work.harness.tail())
        await close_sandboxes(rollout)
        return Evaluation(verdict.reward, details, verdict.components or {})

    async def cleanup(self, rollout: RolloutView) -> None:
        await close_sandboxes(rollout)

"""The ``swe`` handler: resolve a repository issue (SWE-bench, SWE-Gym, R2E-Gym).

INIT starts a sandbox with the task's environment and the repository at
``base_commit`` in ``/workspace`` (see ``environment``). RUN is a tool episode
(bash, str_replace_editor, finish) under a SWE-agent-style prompt; it ends on
finish, max_turns, the context limit or the deadline, and the candidate patch is
``git diff`` of the workspace against its state when the episode began (see ``patch``).
With ``instance.harness`` the episode is an agent harness (mini-swe-agent, or a
command) run in the sandbox behind the recording gateway instead (see ``harness``).
EVAL starts a fresh sandbox from the same environment, applies the candidate patch
(git apply, then fuzzier) less its changes to test infrastructure (see ``protect``),
scans what its Python changes add for reaching into test machinery (see ``scan``:
unresolved without running the tests by default), then the test patch, writes the
canaries into the graded test file (see ``canaries``), runs the tests and grades them
with swebench (see ``evaluate`` and ``grade``); a candidate graded resolved has its
tests run again by a second runner in a fresh sandbox, which must agree (see
``recheck``): reward 1 if resolved, else 0, with the per-test table. An empty patch is
unresolved without running tests (``empty_patch: "run"`` to run them anyway). A
patch that does not apply, or whose tests hang, use up their CPU budget or are killed,
is the agent's failure (reward 0); a test run that cannot start is not (masked): the
interpreter and the test command's program are checked at server start, INIT and
EVAL, before the candidate patch (see ``interpreter``). A stored result is scored again
(re-scoring) by the same EVAL on the patch its evaluation kept (see ``stored``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollserve.agent import BashTool, EditorTool, FinishTool, ToolEnv, ToolEnvConfig
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
from rollserve.handlers.harness import HarnessOutput, harness_limits
from rollserve.handlers.presets import harness_binds, harness_first_prompt, task_size_problem
from rollserve.handlers.sandboxed import close_later, close_sandboxes, open_sandbox, python_with
from rollserve.handlers.swe import environment as envs
from rollserve.handlers.swe import interpreter, protect, recheck, scan, stored
from rollserve.handlers.swe import results as recorded_results
from rollserve.handlers.swe.canaries import Placement
from rollserve.handlers.swe.evaluate import (
    APPLY_FAILED,
    eval_script,
    run_tests,
    run_tests_recorded,
    runner_paths,
    script_halves,
)
from rollserve.handlers.swe.grade import grade_async, swebench, uses_plugin
from rollserve.handlers.swe.harness import HarnessSpec, instance_harness, run_harness
from rollserve.handlers.swe.instances import SWETask, parse_task
from rollserve.handlers.swe.patch import Candidate, apply_patch, snapshot, take_patch
from rollserve.handlers.swe.planting import plant
from rollserve.handlers.swe.prompts import SYSTEM_PROMPT, task_text
from rollserve.sandbox import BubblewrapConfig, View
from rollserve.sandbox.base import WORKDIR, Sandbox, SandboxLimits, SandboxSpec
from rollserve.sandbox.tools import DEFAULT_ENV, BashConfig
from rollserve.validation import describe

# A test run's CPU budget, without test_cpu_seconds: this x its timeout. At 1, a suite
# that runs on one core can never spend it before its wall timeout (an honest slow
# suite is not cut short); one that keeps N cores busy is stopped at 1/N of it.
CPU_SHARE = 1.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHIMS = "/tmp/.rollserve-bin"  # host mode: python/pytest for the agent


@dataclass
class SWEWork:
    """INIT -> RUN: the task, its sandbox, and the workspace's tree when the episode
    began (the agent's changes are measured from it)."""

    task: SWETask
    sandbox: Sandbox
    baseline: str


@dataclass
class SWECandidate:
    """RUN -> EVAL: the candidate patch the episode left."""

    task: SWETask
    candidate: Candidate
    finished: bool = False  # the agent called finish, or its harness exited with 0
    harness: HarnessOutput | None = None  # with instance.harness: what the harness left


class SWEHandler(AgentHandler):
    """Repository issues with hidden FAIL_TO_PASS / PASS_TO_PASS tests."""

    name = "swe"
    defaults = HandlerDefaults(
        max_turns=50,
        max_context_tokens=32768,
        init_timeout=1800.0,  # an image may have to be built into the cache first
        run_timeout=3600.0,
        eval_timeout=2400.0,
        total_timeout=7200.0,
    )
    bash = BashConfig(timeout=180.0, idle_timeout=120.0)
    max_command_seconds = 600.0

    def __init__(self, ctx: HandlerContext) -> None:
        super().__init__(ctx)
        try:
            self.options = envs.SWEOptions(**ctx.options.get(self.name, {}))
        except ValidationError as error:
            known = ", ".join(envs.SWEOptions.model_fields)
            raise ValueError(f"swe handler options: {describe(error)} (known: {known})") from None
        python = self.options.python
        if python and self.options.environment != "image" and self.options.rootfs is None:
            problem = interpreter.static_problem(python, *self._host_view())
            if problem:
                raise ValueError(
                    f"swe handler options: python: {problem} (set 'python' to an "
                    "interpreter with pytest that the sandboxes see)"
                )

    def _host_view(self) -> tuple[list[str], list[str]]:
        """(hidden, shown again): host folders a host-mode sandbox does not see, and
        paths shown inside them anyway; only bubblewrap hides anything."""
        config = getattr(self.ctx.sandboxes, "config", None)
        if not isinstance(config, BubblewrapConfig):
            return [], []
        state_dir = getattr(self.ctx.sandboxes, "state_dir", None)
        view = View(config, Path(state_dir).resolve() if state_dir else None, os.geteuid() == 0)
        hidden = [*view.hidden(envs.hidden_folders(self.options)), "/tmp"]  # (/tmp: private)
        return hidden, view.readonly_paths()

    # --- validation ------------------------------------------------------------------
    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        return parse_task(instance).problem_statement or None

    def validate(self, instance: Mapping[str, Any]) -> None:
        """The instance must parse and, in host mode, its repository must be found
        (a bundle or mirror under a name ``environment.source_names`` gives)."""
        task = self.task(instance)
        too_long = task_size_problem(instance_harness(self.ctx, instance), task.problem_statement)
        if too_long is not None:
            raise InvalidInstance("instance.problem_statement", too_long)
        if task.test_timeout is not None and task.test_timeout > self.options.test_timeout:
            raise InvalidInstance(
                "instance.test_timeout",
                f"at most this server's test_timeout ({self.options.test_timeout:g} s), got {task.test_timeout:g}",
            )
        if not self._images:
            try:
                envs.find_source(task, self.options.mirrors)
            except InfraError as error:
                raise InvalidInstance("instance.repo", error.message) from None

    def task(self, instance: Mapping[str, Any]) -> SWETask:
        """The instance as a task this server can run; InvalidInstance naming the field."""
        task = parse_task(instance)
        if not self._images and task.schema == "r2e-gym":
            raise InvalidInstance(
                "instance.docker_image",
                "R2E-Gym tests live in the instance's image: run with an image runtime (apptainer, docker, podman)",
            )
        if not self._images and not task.base_commit:
            raise InvalidInstance("instance.base_commit", "required without an image runtime")
        return task

    def first_prompt(self, instance: Mapping[str, Any]) -> FirstPrompt | None:
        return harness_first_prompt(self.ctx, instance.get("harness"))

    def images(self, instance: Mapping[str, Any]) -> list[str]:
        """The environment image the instance runs in (for ``rollserve images pull``)."""
        return [envs.image_reference(parse_task(instance), self.options, self._runtime_name)]

    @property
    def _runtime_name(self) -> str | None:
        return self.ctx.sandboxes.name if self.ctx.sandboxes is not None else None

    @property
    def _images(self) -> bool:
        return envs.use_images(self.options, self._runtime_name)

    # --- the stages ---------------------------------------------------------------------
    async def init(self, rollout: RolloutView) -> None:
        task = self.task(rollout.instance)
        # A harness's sandbox caps memory resident (Node, Bun); EVAL's keep RLIMIT_AS,
        # so a task is graded alike whoever acted.
        sandbox = await self._open(rollout, task, harness=instance_harness(self.ctx, rollout.instance))
        if self._images and task.schema == "r2e-gym":
            await envs.hide_r2e_tests(sandbox, self.options)
        env = None if self._images else await self._host_env(sandbox)
        await interpreter.probe(sandbox, task, env, self._activate, self._origin, "INIT")
        # The agent's changes are measured from here (an image may hold files that
        # are untracked or changed against base_commit: they are not the agent's).
        rollout.state = SWEWork(task, sandbox, await snapshot(sandbox))

    async def _open(self, rollout: RolloutView, task: SWETask, harness: HarnessSpec | None = None) -> Sandbox:
        """A sandbox with the task's environment and its repository at base_commit
        (``harness``: the agent's, for that harness: its install folder shown read-only,
        memory capped resident for the whole sandbox)."""
        limits = SandboxLimits(memory_mb=self.options.memory_mb, pids=self.options.pids, cpu_seconds=3600)
        if harness is not None:
            limits = harness_limits(limits)
        binds = harness_binds(harness)
        env = {
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "PIP_NO_INPUT": "1",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
        }
        if self._images:
            spec = SandboxSpec(
                image=envs.image_reference(task, self.options, self._runtime_name),
                limits=limits,
                env=env,
                workspace_seed=self.options.image_repo_dir,
                workspace_aliases=[self.options.image_repo_dir],
                readonly_binds=binds,
                start_timeout=self.options.setup_timeout,
            )
            sandbox = await open_sandbox(self.ctx, rollout, spec)
            await envs.prepare_image_repo(sandbox, self.options)
            return sandbox
        reason = envs.git_available()
        if reason:
            raise InfraError(f"swe handler (host mode): {reason}")
        bundle = await envs.bundle_for(task, self.options)  # (its cache exists before the sandbox)
        rootfs = self.options.rootfs  # (a rootfs shows none of the host's folders)
        spec = SandboxSpec(
            image=str(rootfs) if rootfs else None,
            limits=limits,
            env=env,
            readonly_binds=binds,
            hide=[] if rootfs else envs.hidden_folders(self.options),
        )
        sandbox = await open_sandbox(self.ctx, rollout, spec)
        await envs.materialise(sandbox, task, self.options, bundle)
        return sandbox

    @property
    def _activate(self) -> str | None:
        """What test scripts run first (image mode), None in host mode."""
        return self.options.image_activate if self._images else None

    @property
    def _origin(self) -> str:
        """Where the tests' interpreter comes from, for messages."""
        if self._images:
            return "the image's environment, after the swe option image_activate"
        if self.options.python:
            return f"the swe option python: {self.options.python}"
        return "the python with pytest found in the sandbox (no swe option python)"

    async def _host_env(self, sandbox: Sandbox) -> dict[str, str]:
        """Host mode: the environment in which ``python``, ``python3`` and ``pytest`` are
        the interpreter that has pytest (shims in the sandbox's private /tmp), for the
        agent's shell and the test run alike."""
        python, extra = (self.options.python, {}) if self.options.python else await python_with(sandbox, "pytest")
        shims = (
            f"mkdir -p {SHIMS} && for name in python python3; do "
            f"printf '#!/bin/sh\\nexec %s \"$@\"\\n' {shlex.quote(python)} > {SHIMS}/$name; done && "
            f"printf '#!/bin/sh\\nexec %s -m pytest \"$@\"\\n' {shlex.quote(python)} > {SHIMS}/pytest && "
            f"chmod +x {SHIMS}/*"
        )
        made = await sandbox.exec(shims, timeout=30)
        if not made.ok:
            raise InfraError(f"could not set up the agent's python: {made.failure()}")
        return {**extra, "PATH": f"{SHIMS}:{DEFAULT_PATH}"}

    async def run(self, rollout: RolloutView) -> None:
        work = self.state(rollout, SWEWork)
        task, sandbox = work.task, work.sandbox
        agent_env = {} if self._images else await self._host_env(sandbox)
        harness = instance_harness(self.ctx, rollout.instance)
        output: HarnessOutput | None = None
        if harness is not None:
            output = await run_harness(
                self.ctx, rollout, sandbox, task, harness, agent_env, sandbox.spec.image if self._images else None
            )
            finished = output.exit_code == 0
        else:
            finished = await self._tool_episode(rollout, work, agent_env)
        # Whatever ended the episode (finish, max_turns, the context, the time limit),
        # the workspace's diff is the candidate, as SWE agents auto-submit.
        candidate = await take_patch(sandbox, work.baseline)
        rollout.state = SWECandidate(task, candidate, finished=finished, harness=output)
        await close_sandboxes(rollout)

    async def _tool_episode(self, rollout: RolloutView, work: SWEWork, agent_env: dict[str, str]) -> bool:
        """rollserve's own tool loop (bash, str_replace_editor, finish); True if the
        agent called finish."""
        task, sandbox = work.task, work.sandbox
        config = self.bash
        if not self._images:
            config = config.model_copy(update={"env": {**DEFAULT_ENV, **config.env, **agent_env}})
        bash = BashTool(sandbox, config, max_timeout=self.max_command_seconds)
        close_later(rollout, bash)
        if self._images:
            await bash.session.run(self.options.image_activate)
        finish = FinishTool(
            description="Call when the issue is fixed and verified. Your "
            "changes to the repository are submitted; this ends the task.",
            parameter=None,
        )
        env = ToolEnv(
            [bash, EditorTool(sandbox), finish],
            task_text(task.repo, task.problem_statement),
            SYSTEM_PROMPT,
            tokenizer=self.ctx.tokenizer,
            config=ToolEnvConfig(call_timeout=self.max_command_seconds + 60.0),
        )
        await run_episode(self.ctx, rollout, env)
        return finish.finished

    async def eval(self, rollout: RolloutView) -> Evaluation:
        """The outcome reward, with its components: ``resolved`` (the reward) and
        ``tests`` (the fraction of graded tests that passed; 0 when none ran)."""
        evaluation = await self._eval(rollout)
        tests = evaluation.details.get("tests") or []
        ok = sum(1 for t in tests if isinstance(t, dict) and t.get("ok") is True)
        evaluation.components = {"resolved": evaluation.reward, "tests": ok / len(tests) if tests else 0.0}
        return evaluation

    async def _eval(self, rollout: RolloutView) -> Evaluation:
        state = self.state(rollout, SWECandidate)
        task, candidate = state.task, state.candidate
        details: dict[str, Any] = {
            "schema": task.schema,
            "instance_id": task.instance_id,
            "finished": state.finished,
            "git_patch": candidate.patch,
            "patch_bytes": len(candidate.patch.encode()),
            "patch_too_big": candidate.too_big,
            "binary_files_left_out": candidate.binary_files,
        }
        if state.harness is not None:
            details.update(harness_exit_code=state.harness.exit_code, harness_log_tail=state.harness.tail())
        if candidate.too_big:
            details.update(resolved=False, tests_ran=False, reason="the patch is too big")
            return Evaluation(reward=0.0, details=details)
        split = await asyncio.to_thread(protect.split, candidate.patch, runner_paths(task))
        patch = split.kept
        if split.protected:
            details.update(
                protected_files=split.protected,
                protected_files_action=("failed" if self.options.protected_files == "fail" else "dropped"),
            )
            if self.options.protected_files == "fail":
                details.update(
                    resolved=False,
                    tests_ran=False,
                    reason="the patch changes test infrastructure the grading relies on: " + ", ".join(split.protected),
                )
                return Evaluation(reward=0.0, details=details)
        if not patch.strip() and self.options.empty_patch == "unresolved":
            details.update(resolved=False, tests_ran=False, reason="empty patch")
            return Evaluation(reward=0.0, details=details)
        outcome = await self.run_tests(rollout, task, patch)
        details.update(outcome)
        return Evaluation(reward=1.0 if outcome["resolved"] else 0.0, details=details)

    async def run_tests(self, rollout: RolloutView, task: SWETask, patch: str) -> dict[str, Any]:
        """Apply ``patch`` in a fresh sandbox, run the tests, grade (sandbox closed after)."""
        swebench()  # fail early (infra) if grading cannot work here
        started = time.perf_counter()
        sandbox = await self._open(rollout, task)
        try:
            env = None if self._images else await self._host_env(sandbox)
            # Before the patch: nothing of the candidate can change what this finds.
            await interpreter.probe(
                sandbox, task, env, self._activate, self._origin, "EVAL, before the candidate patch"
            )
            outcome: dict[str, Any] = {"patch_applied": True, "apply_command": None}
            if patch.strip() and not await scan.apply_scanned(sandbox, patch, self.options.machinery, outcome):
                return outcome
            activate = self._activate
            own = script_halves(task, activate)  # (None: the instance's own script)
            halves = own if self.options.canary else None
            plugin = uses_plugin(task)
            token = secrets.token_hex(6)
            prefix = ""
            if plugin:  # outcomes from our plugin, in a folder no patch reaches
                for name, text in recorded_results.files().items():
                    await sandbox.write_file(f"{recorded_results.folder(token)}/{name}", text)
                prefix = recorded_results.shell_setup(f"{WORKDIR}/{recorded_results.folder(token)}")
            timeout, budget = self._test_limits(task)
            placement: Placement | None = None
            records = ""  # (the plugin's, from the server's pipe: see run_tests_recorded)
            if halves is None:
                log, records = await self._run_suite(sandbox, task, prefix + eval_script(task, activate), env, plugin)
            else:  # the set-up, the canaries written in, then the tests
                log = await run_tests(sandbox, task, halves[0], timeout, env, self.options.stopped_tests, budget)
                if APPLY_FAILED not in log:
                    placement = await plant(sandbox, task, self.options.canary_count)
                    more, records = await self._run_suite(
                        sandbox, task, prefix + halves[1], env, plugin, write_test_patch=False
                    )
                    log += more
            recorded = recorded_results.parse(records) if plugin else None
        finally:
            await close_sandboxes(rollout)
        outcome.update(await grade_async(task, log, recorded, placement))
        if plugin and own is not None and self.options.recheck and outcome["resolved"]:
            second = await self._recheck(rollout, task, patch, env is not None)
            outcome["recheck"] = second
            if not second["agreed"]:
                outcome.update(resolved=False, reason=second.get("reason"))
        outcome["eval_seconds"] = round(time.perf_counter() - started, 3)
        outcome["log_tail"] = log[-3000:]
        return outcome

    async def _run_suite(
        self,
        sandbox: Sandbox,
        task: SWETask,
        script: str,
        env: dict[str, str] | None,
        plugin: bool,
        *,
        write_test_patch: bool = True,
    ) -> tuple[str, str]:
        """The test run's log and, where our plugin records the outcomes, its records."""
        timeout, budget = self._test_limits(task)
        if plugin:
            return await run_tests_recorded(
                sandbox,
                task,
                script,
                timeout,
                env,
                self.options.stopped_tests,
                budget,
                write_test_patch=write_test_patch,
            )
        log = await run_tests(
            sandbox, task, script, timeout, env, self.options.stopped_tests, budget, write_test_patch=write_test_patch
        )
        return log, ""

    def _test_limits(self, task: SWETask) -> tuple[float, float]:
        """A test run's wall timeout (the instance's own, if it gives one) and CPU budget."""
        timeout = task.test_timeout or self.options.test_timeout
        return timeout, self.options.test_cpu_seconds or timeout * CPU_SHARE

    async def _recheck(self, rollout: RolloutView, task: SWETask, patch: str, host: bool) -> dict[str, Any]:
        """The second runner (see ``recheck``): the test files again, in a fresh sandbox
        from pristine test files, each test's call observed."""
        sandbox = await self._open(rollout, task)
        try:
            if patch.strip() and not (await apply_patch(sandbox, patch)).ok:
                raise InfraError("the candidate patch applied once but not in the second runner's sandbox")
            env = await self._host_env(sandbox) if host else None
            plan = recheck.Plan.draw()
            for name, text in plan.files().items():
                await sandbox.write_file(f"{plan.folder}/{name}", text)
            activate = None if host else self.options.image_activate
            timeout, budget = self._test_limits(task)
            log, records = await run_tests_recorded(
                sandbox,
                task,
                plan.shell_setup() + eval_script(task, activate),
                timeout,
                env,
                self.options.stopped_tests,
                budget,
            )
        finally:
            await close_sandboxes(rollout)
        seen = await asyncio.to_thread(recheck.parse, records, plan.key)
        checked = await asyncio.to_thread(recheck.verdict, task, seen)
        if not checked["agreed"]:
            checked["log_tail"] = log[-1500:]
        return checked

    # --- re-scoring from the stored patch (see ``stored``) -------------------------------
    rescores_from_messages = False

    def rescore_problem(self, instance: Mapping[str, Any]) -> str | None:
        return None

    def rescore_result_problem(self, evaluation: Mapping[str, Any] | None) -> str | None:
        return stored.problem(evaluation)

    async def restore(self, rollout: RolloutView, evaluation: Mapping[str, Any] | None) -> None:
        """The stored candidate, for EVAL again (no sandbox until EVAL's own)."""
        problem = stored.problem(evaluation)
        if problem is not None:
            raise InfraError(f"swe re-scoring of {rollout.id}: {problem}")
        assert evaluation is not None  # (problem() found its patch)
        candidate, finished, harness = stored.candidate(evaluation)
        rollout.state = SWECandidate(self.task(rollout.instance), candidate, finished, harness)

    async def cleanup(self, rollout: RolloutView) -> None:
        await close_sandboxes(rollout)

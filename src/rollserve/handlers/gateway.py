"""``gateway``: a rollout driven by an agent harness outside rollserve, through the
recording gateway (``agent.gateway``).

RUN opens the rollout's gateway session and waits until the harness ends it
(``POST /v1/gateway/<key>/end``), ``max_turns`` calls were answered, or the time
limit came (``agent.clock``: ``time_limit`` when the harness took the time, a masked
``DeadlineFailure`` when the backend did). The trainer reads the session's key from
``GET /v1/rollouts/{id}/gateway`` and hands it to its harness as
``OPENAI_BASE_URL=<server>/v1/gateway/<key>/v1``. EVAL compares the text of the
policy's last reply (the sampled ids, decoded: what the harness says it got counts
for nothing) with the instance's ``answer``, stripped of surrounding whitespace:
reward 1.0 when equal, else 0.0.

Instance: ``{"answer": "<the reply that earns reward 1>", "tool_calls": "hermes" |
"none", "command": ..., "files": {...}}``; ``tool_calls`` ``hermes`` (default) answers
the policy's ``<tool_call>`` blocks as OpenAI ``tool_calls`` when the harness offers
tools, ``none`` leaves every reply as text (for harnesses that parse actions
themselves). ``calls`` (``contract.calls.GatewayCalls``: ``{"main_model": ...,
"auxiliary": {model: purpose}}``) tells the harness's main-loop calls from its
auxiliary ones (recorded apart, in ``trajectory.auxiliary``); unset, every call is the
main loop's. With ``harness`` the preset says both (its ``[calls]``, and
``instance.harness.tool_calls``): ``calls`` or ``tool_calls`` beside it is a 422.

With ``command``, the harness runs INSIDE the rollout's sandbox (no network): INIT
starts the sandbox with ``files`` in its workspace; RUN binds the session's unix socket
in the sandbox's server folder, read-only at ``/.rollserve``
(``agent.gateway.unix_socket``) and runs ``bash -c <command>`` under the
``forwarder``, which serves the socket on 127.0.0.1 inside and sets
``OPENAI_BASE_URL`` and ``ANTHROPIC_BASE_URL`` (``OPENAI_API_KEY`` and
``ANTHROPIC_API_KEY`` are the session's key; ``ROLLSERVE_PYTHON`` names the python
the forwarder runs on). The episode ends when the command exits
(``stats.harness_exit_code``), when the session ends, or at the time limit; the
command and everything it started is killed then, and the sandbox closes at cleanup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollserve.agent.gateway import GatewaySession
from rollserve.contract.calls import GatewayCalls
from rollserve.contract.validation import field_name
from rollserve.handlers.base import (
    AgentHandler,
    Evaluation,
    FirstPrompt,
    HandlerDefaults,
    InvalidInstance,
    RolloutView,
)
from rollserve.handlers.harness import (
    HarnessOutput,
    gateway_session,
    harness_limits,
    run_in_sandbox,
)
from rollserve.handlers.presets import (
    HarnessSpec,
    harness_binds,
    harness_first_prompt,
    parse_harness,
    run_preset,
    task_size_problem,
)
from rollserve.handlers.sandboxed import close_sandboxes, open_sandbox, python_with
from rollserve.sandbox import workspace_file_problem
from rollserve.sandbox.base import Sandbox, SandboxLimits, SandboxSpec

__all__ = ["GatewayHandler", "GatewayInstance"]


class GatewayInstance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str = Field(
        min_length=1,
        description="the reply that earns reward 1.0 (compared stripped of surrounding whitespace: not blank)",
    )
    tool_calls: Literal["hermes", "none"] = "hermes"
    command: str | None = Field(
        None, min_length=1, description="the harness, run in the rollout's sandbox with bash -c"
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="workspace path -> text, for the sandbox (with command or harness only)"
    )
    calls: GatewayCalls | None = Field(
        None, description="which calls are the harness's main loop (by the model asked) and which auxiliary"
    )
    harness: Any = Field(
        None,
        description="a harness preset run in the "
        'rollout\'s sandbox, e.g. {"preset": "codex"} '
        "(handlers.presets), instead of command",
    )
    task: str = Field("", max_length=30_000, description="the task's text, for a harness (in $ROLLSERVE_TASK_FILE)")

    @field_validator("answer")
    @classmethod
    def _not_blank(cls, answer: str) -> str:
        # Compared stripped: a blank answer would pay an empty (or whitespace) reply.
        if not answer.strip():
            raise ValueError(
                "must not be blank: the reply is compared stripped of "
                "whitespace, so an empty reply would earn reward 1.0"
            )
        return answer


@dataclass
class GatewayState:
    task: GatewayInstance
    session: GatewaySession | None = None
    sandbox: Sandbox | None = None
    python: tuple[str, dict[str, str]] | None = None  # the forwarder's python, its env
    harness: HarnessSpec | None = None  # instance.harness, checked

    def attach(self, session: GatewaySession) -> None:
        self.session = session

    output: HarnessOutput = field(default_factory=HarnessOutput)  # the command's


class GatewayHandler(AgentHandler):
    name = "gateway"
    defaults = HandlerDefaults(
        max_turns=30,
        max_context_tokens=8192,
        init_timeout=10.0,
        run_timeout=600.0,
        eval_timeout=10.0,
        total_timeout=900.0,
    )
    # The sandbox of a command: memory capped resident, for the whole sandbox
    # (handlers/harness.py), not per process as address space.
    sandbox_limits: SandboxLimits = harness_limits()

    def outside_harness(self, instance: Mapping[str, Any]) -> str | None:
        task = _task(instance)
        return "instance.command" if task.command is None and task.harness is None else None

    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        return _task(instance).task or None  # (none: the harness's first message, delimited)

    def validate(self, instance: Mapping[str, Any]) -> None:
        task = _task(instance)
        if task.command is not None and task.harness is not None:
            raise InvalidInstance(
                "instance.harness", "give command or harness, not both (a command is the preset 'command')"
            )
        if task.files and task.command is None and task.harness is None:
            raise InvalidInstance("instance.files", "files go into the sandbox of a command; set instance.command too")
        for key in ("calls", "tool_calls"):
            if task.harness is not None and key in task.model_fields_set:
                raise InvalidInstance(
                    f"instance.{key}",
                    "not with harness: the preset says "
                    "its calls ([calls]) and instance.harness.tool_calls "
                    "its tool-call format",
                )
        if task.harness is not None:
            problem = task_size_problem(parse_harness(self.ctx, task.harness), task.task)
            if problem is not None:
                raise InvalidInstance("instance.task", problem)
        found = workspace_file_problem(task.files)
        if found is not None:
            name, problem = found
            raise InvalidInstance(field_name(("instance", "files", name)), problem)

    def first_prompt(self, instance: Mapping[str, Any]) -> FirstPrompt | None:
        return harness_first_prompt(self.ctx, instance.get("harness"))

    async def init(self, rollout: RolloutView) -> None:
        state = GatewayState(_task(rollout.instance))
        rollout.state = state
        if state.task.harness is not None:
            state.harness = parse_harness(self.ctx, state.task.harness)
        if state.task.command is not None or state.harness is not None:
            spec = SandboxSpec(
                files=state.task.files,
                network=False,
                limits=self.sandbox_limits,
                readonly_binds=harness_binds(state.harness),
            )
            state.sandbox = await open_sandbox(self.ctx, rollout, spec)
            if state.harness is None:  # (a preset's run finds its own python)
                state.python = await python_with(state.sandbox, "asyncio")

    async def run(self, rollout: RolloutView) -> None:
        state = self.state(rollout, GatewayState)
        if state.harness is not None:
            assert state.sandbox is not None
            state.output = await run_preset(
                self.ctx, rollout, state.sandbox, state.harness, {}, task=state.task.task, on_session=state.attach
            )
            return
        parse = state.task.tool_calls == "hermes"
        async with gateway_session(self.ctx, rollout, parse_tool_calls=parse, calls=state.task.calls) as (session, key):
            state.session = session
            try:
                if state.sandbox is not None:
                    assert state.python is not None and state.task.command is not None
                    python, env = state.python
                    await run_in_sandbox(state.sandbox, session, key, state.task.command, python, env, state.output)
                else:
                    await session.wait()
            finally:
                if state.output.exit_code is not None:
                    rollout.add_stats({"harness_exit_code": state.output.exit_code})

    async def eval(self, rollout: RolloutView) -> Evaluation:
        state = self.state(rollout, GatewayState)
        text = state.session.last_text if state.session is not None else None
        got = None if text is None else text.strip()
        reward = 1.0 if got is not None and got == state.task.answer.strip() else 0.0
        details: dict[str, Any] = {"reply": got, "expected": state.task.answer}
        if state.task.command is not None or state.harness is not None:
            details["harness_exit_code"] = state.output.exit_code
            details["harness_log_tail"] = state.output.tail()
        return Evaluation(reward, details, components={"match": reward})

    async def cleanup(self, rollout: RolloutView) -> None:
        state = rollout.state
        if isinstance(state, GatewayState) and state.session is not None and self.ctx.gateway:
            self.ctx.gateway.close(state.session)
        await close_sandboxes(rollout)


def _task(instance: Mapping[str, Any]) -> GatewayInstance:
    try:
        return GatewayInstance.model_validate(instance)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInstance(field_name(("instance", *first["loc"])), first["msg"]) from None

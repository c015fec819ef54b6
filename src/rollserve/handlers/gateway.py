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
"none"}``; ``tool_calls`` ``hermes`` (default) answers the policy's ``<tool_call>``
blocks as OpenAI ``tool_calls`` when the harness offers tools, ``none`` leaves every
reply as text (for harnesses that parse actions themselves).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollserve.agent.gateway.session import GatewayLimits, GatewaySession
from rollserve.contract.validation import field_name
from rollserve.errors import InfraError
from rollserve.handlers.base import (
    AgentHandler,
    Evaluation,
    HandlerDefaults,
    InvalidInstance,
    RolloutView,
)

__all__ = ["GatewayHandler", "GatewayInstance"]


class GatewayInstance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str = Field(min_length=1, description="the reply that earns reward 1.0")
    tool_calls: Literal["hermes", "none"] = "hermes"


@dataclass
class GatewayState:
    task: GatewayInstance
    session: GatewaySession | None = None


class GatewayHandler(AgentHandler):
    name = "gateway"
    defaults = HandlerDefaults(max_turns=30, max_context_tokens=8192, init_timeout=10.0,
                               run_timeout=600.0, eval_timeout=10.0, total_timeout=900.0)

    def validate(self, instance: dict[str, Any]) -> None:
        _task(instance)

    async def init(self, rollout: RolloutView) -> None:
        rollout.state = GatewayState(_task(rollout.instance))

    async def run(self, rollout: RolloutView) -> None:
        state = self.state(rollout, GatewayState)
        gateway = self.ctx.gateway
        if gateway is None:
            raise InfraError("this server has no gateway: the gateway handler cannot run")
        if rollout.llm is None:
            raise InfraError("no LLM session was attached to the rollout before RUN")
        limits = GatewayLimits(
            sampling=rollout.sampling, max_turns=rollout.max_turns,
            max_context_tokens=rollout.max_context_tokens,
            deadline=rollout.agent_deadline(asyncio.get_running_loop().time()),
            parse_tool_calls=state.task.tool_calls == "hermes")
        session = GatewaySession(rollout.id, rollout.llm, self.ctx.tokenizer,
                                 rollout.trajectory, limits)
        state.session = session
        gateway.open(session)
        try:
            await session.wait()
        finally:
            gateway.close(session)
            rollout.trajectory.ended_by = session.ended_by
            rollout.add_time("llm", session.stats.llm_seconds)
            rollout.add_time("harness", session.stats.env_seconds)
            rollout.add_stats({"gateway_calls": session.calls,
                               "context_refusals": session.context_refusals})

    async def eval(self, rollout: RolloutView) -> Evaluation:
        state = self.state(rollout, GatewayState)
        text = state.session.last_text if state.session is not None else None
        got = None if text is None else text.strip()
        reward = 1.0 if got is not None and got == state.task.answer.strip() else 0.0
        return Evaluation(reward, {"reply": got, "expected": state.task.answer})

    async def cleanup(self, rollout: RolloutView) -> None:
        state = rollout.state
        if isinstance(state, GatewayState) and state.session is not None and self.ctx.gateway:
            self.ctx.gateway.close(state.session)


def _task(instance: dict[str, Any]) -> GatewayInstance:
    try:
        return GatewayInstance.model_validate(instance)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInstance(field_name(("instance", *first["loc"])), first["msg"]) from None

"""The gateway's operations, as the API calls them (``agent.gateway`` does the work).

A harness's call names its session by key; an unknown key (never made, another
server's, or of a rollout whose RUN is over) is ``UnknownKey`` (a typed refusal:
the API answers it, ``agent.gateway.wire.ERRORS``),
found before the call's body is read (``session``); the body is then read under the
session's admission and size bound (``agent.gateway.bounds``).
A call's LLM requests are bounded by the session's deadline, as a rollout's own
stages bound theirs (``llm.routing.deadline``).
"""

from __future__ import annotations

import asyncio

from rollserve.agent.gateway import (
    Gateway,
    GatewayReply,
    GatewaySession,
    anthropic_wire,
    responses_wire,
    wire,
)
from rollserve.agent.gateway.base import BodyTooLarge, GatewayRefusal, UnknownKey
from rollserve.contract.gateway import ChatCompletionRequest, GatewayInfo
from rollserve.engine.errors import NotFound
from rollserve.llm.routing import call_deadline

__all__ = [
    "BodyTooLarge",
    "GatewayRefusal",
    "GatewayReply",
    "GatewaySession",
    "Gateways",
    "UnknownKey",
    "anthropic_wire",
    "responses_wire",
    "wire",
]


class Gateways:
    """Calls into the live gateway sessions, and what the trainer may read of them."""

    def __init__(self, gateway: Gateway, closing: asyncio.Event | None = None) -> None:
        self._gateway = gateway
        self._closing = closing if closing is not None else asyncio.Event()  # set at shutdown

    def session(self, key: str) -> GatewaySession:
        """The live session ``key`` names; ``UnknownKey`` when none has it."""
        session = self._gateway.get(key)
        if session is None:
            raise UnknownKey("unknown gateway key: no live rollout has it (a key is valid only while its rollout runs)")
        return session

    async def complete(
        self, session: GatewaySession, request: ChatCompletionRequest, call_ids: str = "call_", size: int | None = None
    ) -> GatewayReply:
        """Answer one admitted chat call of ``session`` (tool call ids start
        ``call_ids``; ``size``: its body's bytes)."""
        with call_deadline(session.limits.deadline):
            return await session.complete(request, call_ids, size)

    async def count_tokens(
        self, session: GatewaySession, request: ChatCompletionRequest, size: int | None = None
    ) -> int:
        """The policy tokenizer's count of ``request`` rendered whole (nothing sampled)."""
        return await session.count_tokens(request, size)

    def end(self, key: str) -> None:
        """The harness is done: the session takes no more calls and its RUN ends."""
        self.session(key).finish("finished")

    async def info(self, rollout_id: str, wait: float = 0.0) -> GatewayInfo:
        """The rollout's session (waiting up to ``wait`` seconds for its RUN to open
        it, or until the service begins to shut down); ``NotFound`` when it has none."""
        finding = asyncio.ensure_future(self._gateway.key_of(rollout_id, wait))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((finding, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            finding.cancel()
        if finding.done() and not finding.cancelled():
            found = finding.result()
        else:  # shutting down: what there is now
            found = await self._gateway.key_of(rollout_id, 0.0)
        if found is None:
            raise NotFound(
                f"rollout {rollout_id!r} has no gateway session open (it is not a "
                "gateway rollout, its RUN has not started, or it is over)"
            )
        key, session = found
        return GatewayInfo(rollout_id=rollout_id, key=key, base_url=f"/v1/gateway/{key}/v1", ended=session.ended)

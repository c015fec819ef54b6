"""The gateway's contract with whoever serves it: what a harness's call may be refused.

A refusal says WHAT is wrong, never how HTTP answers it: its kind (the class), its
message, OpenAI's ``code`` for that kind, and, for a request at fault, the ``param``
naming the field. The servers (``api.routes_gateway``, ``agent.gateway.unix_socket``)
answer each kind with the status and error type of ONE table, in the wire module they
share (``agent.gateway.wire.ERRORS``; Anthropic's shape in ``anthropic_wire``).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "POLICY_MODEL",
    "BackendFailed",
    "BadRequest",
    "BodyTooLarge",
    "ContextLengthExceeded",
    "GatewayRefusal",
    "SessionEnded",
    "TimeLimit",
    "TooManyCalls",
    "UnknownKey",
    "UnknownRoute",
]

# The model name a harness is told to ask for and ``/models`` lists (a call may name
# any model: the policy answers).
POLICY_MODEL = "rollserve-policy"


class GatewayRefusal(Exception):
    """A call the gateway refuses: ``message`` for the harness, ``code`` (OpenAI's
    error code of this kind, if it has one) and ``param`` (the field at fault)."""

    code: ClassVar[str | None] = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(GatewayRefusal):
    """The request is not one the gateway can take (not JSON it can hold, not a chat
    request, messages the chat template cannot render); ``param`` names the field."""


class ContextLengthExceeded(BadRequest):
    """The prompt leaves no room to sample within the context limit."""

    code = "context_length_exceeded"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages")


class UnknownKey(GatewayRefusal):
    """The call names no live session (a key never made, another server's or another
    sandbox's, or of a rollout whose RUN is over)."""

    code = "invalid_api_key"


class SessionEnded(GatewayRefusal):
    """The session has ended: it takes no more calls."""

    code = "session_ended"


class TooManyCalls(GatewayRefusal):
    """The session already holds as many calls in progress as it may."""

    code = "too_many_calls"


class TimeLimit(GatewayRefusal):
    """The rollout's time limit passed while the call waited."""

    code = "time_limit"


class BackendFailed(GatewayRefusal):
    """The inference backend failed the call (and with it the rollout)."""

    code = "backend_error"


class BodyTooLarge(GatewayRefusal):
    """The request body is past the session's bound (``bounds.max_body_bytes``)."""

    code = "request_too_large"


class UnknownRoute(GatewayRefusal):
    """No such route on the gateway's socket."""

    code = "unknown_url"

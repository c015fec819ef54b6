"""Typed failures.

Every failure a rollout can end with is one of these kinds:

- ``infra``: something outside the agent broke (sandbox, inference server,
  scorer, server restart). Never scored: the result carries ``mask: true``.
- ``agent``: the agent itself did something that ends the episode. Scored.
- ``timeout``: a bounded wait ran out. Masked, since it says nothing about
  whether the answer was right.
"""

from __future__ import annotations

from typing import Literal

FailureKind = Literal["infra", "agent", "timeout"]


class RolloutError(Exception):
    """Base of every failure a handler or backend may raise on purpose."""

    kind: FailureKind = "infra"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InfraError(RolloutError):
    """Infrastructure broke: masked, never scored as a wrong answer."""

    kind: FailureKind = "infra"


class PromptTooLongError(InfraError):
    """The episode's opening prompt leaves no room to sample within the context limit:
    nothing the policy produced exists to score, so the rollout is masked (a data or
    configuration problem, not the agent's doing)."""


class AgentError(RolloutError):
    """The agent's own failure: scored."""

    kind: FailureKind = "agent"


class TimeoutFailure(RolloutError):
    """A bounded wait inside a stage ran out (a test run past its limit): masked."""

    kind: FailureKind = "timeout"


class LLMError(InfraError):
    """An inference backend failed (connection, 5xx, timeout, malformed reply).

    ``status``: the HTTP status when the server answered one; ``backend``: which
    backend failed; ``attempts``: how many tries the call made in all (the router
    sets it); ``retryable``: whether another try (on another backend) may succeed.
    Connection errors, 5xx, 429 and timeouts are; a 4xx or a reply we cannot trust
    is not.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        backend: str | None = None,
        attempts: int = 1,
        retryable: bool = True,
    ):
        super().__init__(message)
        self.status = status
        self.backend = backend
        self.attempts = attempts
        self.retryable = retryable

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


class NodeLost(InfraError):
    """The cluster node running the rollout's stage died (its worker or its raylet):
    the attempt is over, and the engine runs the rollout again from INIT on another
    node while attempts remain (``engine.max_attempts``), else it ends masked."""

    def __init__(self, message: str, node: str):
        super().__init__(message)
        self.node = node


class PromptTooLongError(InfraError):
    """The episode's opening prompt leaves no room to sample within the context limit:
    nothing the policy produced exists to score, so the rollout is masked (a data or
    configuration problem, not the agent's doing)."""


class AgentError(RolloutError):
    """The agent's own failure: scored."""

    kind: FailureKind = "agent"


class JudgeRefused(AgentError):
    """A judge refused what it was asked to grade for what the policy wrote: its reply
    ran past the judge's bound, or the judge's server refused the request's content (a
    400, 413 or 422: the prompt, which holds the policy's text, too long for its window).
    The policy's doing: the judge's score is the scale's lowest (unparsed), never a mask."""


class TimeoutFailure(RolloutError):
    """A bounded wait inside a stage ran out (a test run past its limit): masked."""

    kind: FailureKind = "timeout"


class DeadlineFailure(TimeoutFailure):
    """The RUN stage's time ran out and the infrastructure took it (waiting on the LLM
    backend, not the agent's tools): masked, and the rollout ends ``timed_out`` as when
    the engine's own deadline passes."""


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


class ContextWindowError(LLMError):
    """The prompt (with room for one sampled token) does not fit the backend's context
    window: the backend refused it (a 400 naming the context length) or it was not sent.
    The agent loop ends the episode ``context_exhausted`` (scored) when the policy has
    sampled a turn, and masks it (``PromptTooLongError``) when it has not; a judge's
    prompt past the judge's window is the judge refusing it (``JudgeRefused``: the
    scale's lowest score, never a mask a policy could buy); anywhere else it is an
    ``LLMError`` (masked)."""

    def __init__(self, message: str, *, backend: str | None = None, status: int | None = None):
        super().__init__(message, status=status, backend=backend, retryable=False)


def context_window_error(error: BaseException) -> ContextWindowError | None:
    """The ``ContextWindowError`` that ``error`` is or was caused by (the router wraps
    the last error of a call that took several tries), else None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ContextWindowError):
            return seen
        seen = seen.__cause__
    return None

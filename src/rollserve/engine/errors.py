"""What the engine's operations refuse, typed: the front end (``rollserve.api``) maps
each kind to its answer (an HTTP status there); the engine knows no protocol.

Every error carries ``message`` (one line) and, when one field of the request is at
fault, ``field`` as the user wrote it (``tasks[1].instance.question``).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every refusal of an engine operation."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field


class NotFound(EngineError):
    """No such rollout or group (unknown, or past retention)."""


class InvalidTask(EngineError):
    """A task does not fit: its instance, its size, its id within the batch."""

    def __init__(self, field: str, message: str):
        super().__init__(message, field)


class UnknownDataSource(InvalidTask):
    """The task names a data source no handler serves (the message lists the known ones)."""


class Conflict(InvalidTask):
    """A client-chosen id is taken by a different task."""


class StillRunning(Conflict):
    """A re-scoring under this idempotency key is still running: its answer is not
    there yet; the same request again after ``retry_after`` seconds gets it."""

    def __init__(self, key: str, retry_after: float):
        super().__init__(
            "idempotency_key",
            f"the re-scoring under key {key!r} is still running; send the same request again to get its answer",
        )
        self.retry_after = retry_after


class BatchTooLarge(InvalidTask):
    """The batch needs more rollout slots than the engine ever admits at once."""

    def __init__(self, wanted: int, limit: int):
        super().__init__(
            "tasks",
            f"the batch needs {wanted} rollout slots but the server admits "
            f"at most {limit} at once (--max-pending): it can never fit; "
            "split it into smaller batches",
        )
        self.wanted = wanted
        self.limit = limit


class QueueFull(EngineError):
    """Not enough free rollout slots now; the whole batch was refused, so retrying it
    after ``retry_after`` seconds cannot duplicate work."""

    def __init__(self, wanted: int, free: int, limit: int, retry_after: float):
        super().__init__(
            f"the batch needs {wanted} rollout slots but only {max(free, 0)} of "
            f"{limit} are free; retry later or raise --max-pending"
        )
        self.wanted = wanted
        self.free = free
        self.limit = limit
        self.retry_after = retry_after

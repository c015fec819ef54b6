"""Checking dataset rows offline, as the API checks a submission, without a server.

Each row must be a valid ``TaskRequest`` (the API's own model) whose instance its
handler's ``validate`` accepts. Handlers are built with an offline
``HandlerContext`` whose heavy pieces (tokenizer, scoring processes, sandbox
runtime) are created only if a handler actually uses them: ``validate`` and
``images`` never should, so checking a dataset loads no model and starts nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from rollserve.contract import TaskRequest
from rollserve.datasets import DatasetRow
from rollserve.handlers import HandlerRegistry, UnknownDataSource
from rollserve.handlers.base import AgentHandler, HandlerContext, InvalidInstance
from rollserve.llm.tokens import DEFAULT_TOKENIZER
from rollserve.validation import describe

if TYPE_CHECKING:
    from rollserve.llm.tokens import ChatTokenizer


@dataclass
class RowCheck:
    row: DatasetRow
    error: str | None = None  # "field: message"; None: the row is valid

    @property
    def ok(self) -> bool:
        return self.error is None


class LazyObject:
    """Stands in for an object that is built on first attribute access."""

    def __init__(self, build: Callable[[], Any], what: str):
        self._build = build
        self._what = what
        self._made: Any = None

    def __getattr__(self, name: str) -> Any:  # only called for attributes not set here
        if name.startswith("_"):  # (copy/pickle probes, or before __init__ ran)
            raise AttributeError(name)
        if self._made is None:
            self._made = self._build()
        return getattr(self._made, name)

    def __repr__(self) -> str:
        return f"<lazy {self._what}>"


def offline_context(
    runtime: str = "bubblewrap",
    tokenizer: str = DEFAULT_TOKENIZER,
    state_dir: Path | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> HandlerContext:
    """A HandlerContext for validating instances and listing images without a server."""
    from rollserve.handlers import ScoringPool
    from rollserve.sandbox.registry import LazyRuntime  # creates nothing until first start

    def load() -> Any:
        from rollserve.llm.tokens import load_tokenizer

        return load_tokenizer(tokenizer)

    # The stand-in loads the tokenizer if a handler ever reads it (validate and images
    # should not): typed as what it stands in for.
    lazy_tokenizer = cast("ChatTokenizer", LazyObject(load, f"tokenizer {tokenizer}"))
    return HandlerContext(
        tokenizer=lazy_tokenizer,
        scoring=ScoringPool(workers=1),
        sandboxes=LazyRuntime(runtime, state_dir),
        options=dict(options or {}),
    )


class DatasetChecker:
    """Checks rows against the handlers of ``registry`` (built offline, once each).

    ``remote_handlers``: the data sources a remote server serves; a row naming one
    this machine does not know is left for that server to check.
    """

    def __init__(
        self,
        registry: HandlerRegistry | None = None,
        context: HandlerContext | None = None,
        remote_handlers: Collection[str] = (),
    ):
        self.registry = registry if registry is not None else HandlerRegistry()
        self.context = context if context is not None else offline_context()
        self.remote_handlers = set(remote_handlers)
        self._handlers: dict[str, AgentHandler | None] = {}
        self._build_errors: dict[str, str] = {}

    def handler(self, data_source: str) -> AgentHandler | None:
        """The handler for ``data_source``; None if only the remote server has it.
        Raises ``ValueError("field: message")`` if there is none."""
        if data_source in self._build_errors:
            raise ValueError(self._build_errors[data_source])
        if data_source in self._handlers:
            return self._handlers[data_source]
        try:
            handler = self.registry.create(data_source, self.context)
        except UnknownDataSource as exc:
            if data_source in self.remote_handlers:
                self._handlers[data_source] = None
                return None
            self._build_errors[data_source] = f"data_source: {exc}"
            raise ValueError(self._build_errors[data_source]) from None
        except Exception as exc:  # a plugin whose constructor wants more than an offline context
            self._build_errors[data_source] = (
                f"data_source: handler {data_source!r} cannot be built here: {type(exc).__name__}: {exc}"
            )
            raise ValueError(self._build_errors[data_source]) from None
        self._handlers[data_source] = handler
        return handler

    def check(self, row: DatasetRow) -> RowCheck:
        if row.error is not None or row.task is None:
            return RowCheck(row, row.error or "row: not a task")
        try:
            task = TaskRequest.model_validate(row.task)
        except ValidationError as exc:
            return RowCheck(row, describe(exc, empty="row"))
        try:
            handler = self.handler(task.data_source)
        except ValueError as exc:
            return RowCheck(row, str(exc))
        if handler is None:
            return RowCheck(row)
        try:
            handler.validate(task.instance)
        except InvalidInstance as exc:
            field = exc.field if exc.field.startswith("instance") else f"instance.{exc.field}"
            return RowCheck(row, f"{field}: {exc.message}")
        except Exception as exc:  # the handler's own bug, reported against the row
            return RowCheck(row, f"instance: {task.data_source}.validate() failed: {type(exc).__name__}: {exc}")
        return RowCheck(row)

    def check_all(self, rows: Iterable[DatasetRow], max_errors: int | None = None) -> list[RowCheck]:
        """Every row's check, stopping after ``max_errors`` invalid rows (if given)."""
        checks: list[RowCheck] = []
        errors = 0
        for row in rows:
            check = self.check(row)
            checks.append(check)
            errors += not check.ok
            if max_errors is not None and errors >= max_errors:
                break
        return checks

    def images(self, row: DatasetRow) -> list[str]:
        """The environment images a valid row's handler says it needs (its
        ``AgentHandler.images``: none by default; none either for a handler only the
        remote server has). Raises ``ValueError`` naming what went wrong."""
        assert row.data_source is not None
        handler = self.handler(row.data_source)
        if handler is None:
            return []
        try:
            images: object = handler.images(row.instance)
        except Exception as exc:
            raise ValueError(f"{row.data_source}.images() failed: {type(exc).__name__}: {exc}") from None
        if (
            inspect.isawaitable(images)
            or not isinstance(images, (list, tuple))
            or not all(isinstance(i, str) and i for i in images)
        ):
            raise ValueError(
                f"{row.data_source}.images() must return a list of image references (strings), got {images!r}"
            )
        return list(images)


def images_needed(
    checker: DatasetChecker, checks: Iterable[RowCheck]
) -> tuple[dict[str, list[int]], list[tuple[int, str]]]:
    """(image reference -> the row numbers needing it, in first-seen order;
    [(row number, error)] for rows whose handler could not list them). Invalid rows
    are left out."""
    needed: dict[str, list[int]] = {}
    errors: list[tuple[int, str]] = []
    for check in checks:
        if not check.ok:
            continue
        try:
            references = checker.images(check.row)
        except ValueError as exc:
            errors.append((check.row.number, str(exc)))
            continue
        for reference in references:
            needed.setdefault(reference, []).append(check.row.number)
    return needed, errors

"""Running a whole dataset through a rollserve server (``rollserve run``).

Rows are submitted in batches, never more than ``max_in_flight`` rollouts
unfinished at once (a 429 is waited out, as the client does), and results are read
from the server's results cursor (``GET /v1/results``) from where it stood when the
run began, keeping only this run's tasks. Each result is appended to the output
JSONL as it arrives.

Crash safety: every row is submitted under a stable client id (``datasets.client_id``),
so a rerun gets the groups the server already has (their finished results are
fetched, nothing runs twice); with ``resume`` the samples already in the output
file are neither fetched nor written again.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar

import httpx
from pydantic import ValidationError

from rollserve.client.aio import AsyncClient
from rollserve.client.calls import RollserveError
from rollserve.client.evaluation import EvaluationReport, Graded, evaluate
from rollserve.contract import RolloutResult, SubmitResponse
from rollserve.datasets import DatasetRow, client_id

TRANSPORT_RETRIES = 5
P = ParamSpec("P")
R = TypeVar("R")
_TASK_INDEX = re.compile(r"tasks\[(\d+)\]")


class RunAborted(Exception):
    """The run cannot go on (server unreachable, refused the token, ...)."""


@dataclass
class RunItem:
    """One dataset row, as submitted."""

    number: int  # the row number in the file
    label: str | None
    data_source: str
    task: dict[str, Any]  # the API task, with its client id
    remaining: int = 0  # samples not yet in the output
    submitted: bool = False
    error: str | None = None  # why the server refused it

    @property
    def id(self) -> str:
        return str(self.task["id"])


@dataclass
class RunOptions:
    sampling: dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    timeouts: dict[str, Any] | None = None
    batch_size: int = 64  # tasks per POST
    max_in_flight: int = 512  # rollouts submitted and not finished
    poll_wait: float = 10.0  # long-poll of the results cursor

    def settings(self) -> dict[str, Any]:
        """What, besides the row, decides a rollout: part of the client ids."""
        return {"sampling": self.sampling or {}, "agent": self.agent or {}, "timeouts": self.timeouts or {}}


@dataclass
class RunProgress:
    rows: int = 0  # rows of the dataset in this run
    skipped_rows: int = 0  # all samples already in the output (resume)
    total: int = 0  # rollouts to fetch this time
    submitted: int = 0
    finished: int = 0
    failed: int = 0  # finished with a status other than completed
    reused_groups: int = 0  # the server already had them (idempotent resubmission)
    rewards: list[float] = field(default_factory=list)

    @property
    def mean_reward(self) -> float | None:
        return statistics.fmean(self.rewards) if self.rewards else None


@dataclass
class RunReport:
    progress: RunProgress
    outcomes: list[Graded]  # this run's and, on resume, those already in the output
    rejected: list[RunItem]  # rows the server refused, with ``error``
    foreign_results: int = 0  # results in the output of rows or settings not in this run

    def evaluation(self, ks: Sequence[int] | None = None, threshold: float = 1.0) -> EvaluationReport:
        """pass@k, majority, mean reward with its interval... per data_source."""
        return evaluate(self.outcomes, ks=ks, threshold=threshold)

    def rejected_by_data_source(self) -> dict[str, int]:
        return dict(sorted(Counter(item.data_source for item in self.rejected).items()))


def plan(rows: list[DatasetRow], dataset: str, options: RunOptions, n: int | None = None) -> list[RunItem]:
    """The valid rows as tasks with their client ids (``n`` overrides each row's).
    Raises ValueError if two rows carry the same ``id`` of their own."""
    items: dict[str, RunItem] = {}
    for row in rows:
        if row.task is None or row.data_source is None:
            continue
        task = dict(row.task)
        if n is not None:
            task["n"] = n
        instance, metadata = task.get("instance"), task.get("metadata")
        instance_id = instance.get("instance_id") if isinstance(instance, dict) else None
        if isinstance(instance_id, str) and (metadata is None or isinstance(metadata, dict)):
            # The results name the instance (a SWE-bench id, say), not only the row.
            task["metadata"] = {"instance_id": instance_id, **(metadata or {})}
        task["id"] = client_id(dataset, row.number, task, options.settings())
        if task["id"] in items:
            raise ValueError(f"rows {items[task['id']].number} and {row.number} have the same id {task['id']!r}")
        items[task["id"]] = RunItem(row.number, row.label, row.data_source, task)
    return list(items.values())


def _line(result: RolloutResult) -> str:
    """The result as the output keeps it: one JSON line, without the server's cursor."""
    return json.dumps(result.model_dump(mode="json", exclude={"seq"}))


def _trim_torn_tail(output: Path) -> bytes:
    """The whole lines of ``output``: a last line a crash cut short is cut from the file
    (its rollout is fetched again); a whole last line without its newline gets one."""
    data = output.read_bytes()
    complete, _, tail = data.rpartition(b"\n")
    if not tail.strip():
        return complete
    try:
        json.loads(tail)
        complete = data  # a whole last line without its newline: kept
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass  # torn: dropped (its rollout is fetched again)
    with output.open("r+b") as fh:
        fh.truncate(len(complete))
        if complete:
            fh.seek(len(complete))
            fh.write(b"\n")
    return complete


class DatasetRun:
    def __init__(
        self,
        client: AsyncClient,
        items: list[RunItem],
        output: Path,
        options: RunOptions | None = None,
        resume: bool = False,
        on_change: Callable[[RunProgress], None] | None = None,
    ):
        self.client = client
        self.items = {item.id: item for item in items}
        if len(self.items) != len(items):
            raise ValueError("two rows have the same id")
        self.output = Path(output)
        self.options = options or RunOptions()
        self.resume = resume
        self.on_change = on_change or (lambda progress: None)
        self.progress = RunProgress(rows=len(items))
        self.outcomes: list[Graded] = []
        self.rejected: list[RunItem] = []
        self.foreign = 0
        self._have: set[tuple[str, int]] = set()  # (task id, sample index) in the output
        self._in_flight = 0  # rollouts submitted whose results are not in yet
        self._open_rows = 0  # rows still waiting for results (not rejected)
        self._changed = asyncio.Event()
        self._out: IO[str] | None = None
        self._limit = self.options.max_in_flight  # lowered to the server's max_pending

    # --- the output file -------------------------------------------------------------
    def _load_output(self) -> None:
        """On resume: note the samples already written; drop a last line a crash cut short."""
        if not self.output.exists():
            return
        for line in _trim_torn_tail(self.output).splitlines():
            self._note_written(line)

    def _note_written(self, line: bytes) -> None:
        """A line of the output on resume: a result of one of this run's rows is a sample
        already had; a result of no row, or a record that is no result, is foreign."""
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if not isinstance(record, dict):
            return
        try:
            result = RolloutResult.model_validate(record)
        except ValidationError:  # not a result of rollserve's
            self.foreign += 1
            return
        item = self.items.get(result.task_id)
        if item is None:
            self.foreign += 1
        elif (item.id, result.sample_index) not in self._have:
            self._have.add((item.id, result.sample_index))
            self.outcomes.append(Graded.of(result))

    def _record(self, result: RolloutResult) -> None:
        item = self.items.get(result.task_id)
        if item is None or (item.id, result.sample_index) in self._have or self._out is None:
            return
        self._have.add((item.id, result.sample_index))
        self._out.write(_line(result) + "\n")
        self._out.flush()
        outcome = Graded.of(result)
        self.outcomes.append(outcome)
        progress = self.progress
        progress.finished += 1
        progress.failed += outcome.status != "completed"
        if outcome.reward is not None and not outcome.mask:
            progress.rewards.append(outcome.reward)
        if item.submitted:
            self._in_flight -= 1
        item.remaining -= 1
        if item.remaining == 0 and item.error is None:
            self._open_rows -= 1
        self._changed.set()
        self.on_change(progress)

    # --- talking to the server ------------------------------------------------------------
    async def _call(self, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
        """A client call, retried while the server is unreachable (submits are
        idempotent: a retry of a batch that did arrive gets the same groups back)."""
        attempt = 0
        while True:
            try:
                return await fn(*args, **kwargs)
            except httpx.TransportError as exc:
                if attempt == TRANSPORT_RETRIES:
                    raise RunAborted(
                        f"cannot reach the server at {self.client.base_url}: {type(exc).__name__}: {exc}"
                    ) from None
                await asyncio.sleep(min(2.0**attempt, 16.0))
                attempt += 1
            except RollserveError as exc:
                if exc.status in (401, 403, 404):
                    raise RunAborted(f"the server refused {fn.__name__}: {exc}") from None
                raise

    async def _read_results(self, cursor: int) -> None:
        while True:
            # a re-scored result is the same sample scored again: never a new sample
            page = await self._call(
                self.client.results, after=cursor, limit=500, wait=self.options.poll_wait, rescored=False
            )
            for result in page.results:
                self._record(result)
            cursor = page.next

    def _reject(self, item: RunItem, error: str) -> None:
        item.error = error
        self.rejected.append(item)
        if item.remaining > 0:
            self._open_rows -= 1
        self._changed.set()

    async def _submit_batch(self, batch: list[RunItem]) -> None:
        conflicts = 0
        while batch:
            try:
                accepted = await self._call(
                    self.client.submit,
                    [item.task for item in batch],
                    sampling=self.options.sampling,
                    agent=self.options.agent,
                    timeouts=self.options.timeouts,
                )
            except RollserveError as exc:
                if exc.status == 429:  # still full after the client's own retries
                    batch = await self._when_full(batch)
                    continue
                named = {int(i) for i in _TASK_INDEX.findall(str(exc.detail)) if int(i) < len(batch)}
                if not named and exc.status == 409 and conflicts < 3:  # a concurrent submit
                    conflicts += 1
                    await asyncio.sleep(1.0)
                    continue
                batch = self._refused(batch, named, exc)
                continue
            await self._accepted(batch, accepted)
            return

    async def _when_full(self, batch: list[RunItem]) -> list[RunItem]:
        """The server is full: other trainers hold the room, so smaller batches fit sooner.
        Submits the first half of ``batch`` and returns the rest to submit (a single task
        is returned after a pause)."""
        if len(batch) > 1:
            half = len(batch) // 2
            await self._submit_batch(batch[:half])
            return batch[half:]
        await asyncio.sleep(5.0)
        return batch

    def _refused(self, batch: list[RunItem], named: set[int], exc: RollserveError) -> list[RunItem]:
        """Reject the tasks the refusal names (all of ``batch`` when it names none) and
        return the others to submit again; a server error naming none aborts the run."""
        if not named and exc.status >= 500:
            raise RunAborted(f"the server failed a submit: {exc}") from None
        for index in sorted(named) or range(len(batch)):
            self._reject(batch[index], str(exc.detail))
        return [item for i, item in enumerate(batch) if named and i not in named]

    async def _accepted(self, batch: list[RunItem], accepted: SubmitResponse) -> None:
        """Count ``batch`` in flight; record the results groups the server already had
        (``duplicate``: an earlier run submitted them) finished before this run's cursor."""
        reused = []
        for item, group in zip(batch, accepted.groups):
            item.submitted = True
            self._in_flight += item.remaining
            self.progress.submitted += item.remaining
            if group.duplicate:
                reused.append(group.group_id)
        self.progress.reused_groups += len(reused)
        self.on_change(self.progress)
        for group_id in reused:  # results that finished before this run's cursor
            view = await self._call(self.client.group, group_id, wait=0.0, results=True)
            for member in view.rollouts:
                if member.result is not None:
                    self._record(member.result)

    async def _submit_all(self, todo: list[RunItem]) -> None:
        queue = deque(todo)
        limit = self._limit
        while queue:
            batch: list[RunItem] = []
            need = 0
            while queue and len(batch) < self.options.batch_size:
                item = queue[0]
                if item.remaining == 0:  # its results came in already (an earlier run's)
                    queue.popleft()
                    continue
                if int(item.task.get("n", 1)) > limit:  # would never fit: the server says 429
                    self._reject(
                        queue.popleft(),
                        f"n={item.task.get('n')} is more rollouts than the server admits at once (max_pending {limit})",
                    )
                    continue
                if (batch or self._in_flight) and self._in_flight + need + item.remaining > limit:
                    break
                batch.append(queue.popleft())
                need += item.remaining
            if batch:
                await self._submit_batch(batch)
            elif queue:
                self._changed.clear()
                await self._changed.wait()

    async def _until_done(self, reader: asyncio.Task[None]) -> None:
        while self._open_rows > 0:
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if reader.done():
                reader.result()  # raises what stopped the reader
                raise RunAborted("the results reader stopped")

    # --- the run -----------------------------------------------------------------------------
    async def run(self) -> RunReport:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        if self.resume:
            self._load_output()
        else:
            self.output.write_text("")
        todo = []
        for item in self.items.values():
            n = int(item.task.get("n", 1))
            item.remaining = sum((item.id, i) not in self._have for i in range(n))
            if item.remaining:
                todo.append(item)
        self.progress.skipped_rows = len(self.items) - len(todo)
        self.progress.total = sum(item.remaining for item in todo)
        self._open_rows = len(todo)
        self.on_change(self.progress)
        if todo:
            status = await self._call(self.client.status)
            cursor = status.last_seq
            self._limit = min(self._limit, status.max_pending)
            with self.output.open("a", encoding="utf-8") as self._out:
                reader = asyncio.create_task(self._read_results(cursor))
                submitter = asyncio.create_task(self._submit_all(todo))
                try:
                    await asyncio.wait({submitter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    if not submitter.done():  # the reader stopped first: raise what stopped it
                        reader.result()
                        raise RunAborted("the results reader stopped")
                    submitter.result()
                    await self._until_done(reader)
                finally:
                    for task in (reader, submitter):
                        task.cancel()
                    await asyncio.gather(reader, submitter, return_exceptions=True)
        return RunReport(self.progress, self.outcomes, self.rejected, self.foreign)

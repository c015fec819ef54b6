"""Durable state of every rollout: SQLite in WAL mode, behind a small interface.

Every state change and every result is written. Results get a monotonically
increasing ``seq`` when they become terminal, so a trainer reads them in
completion order with a cursor (``after=seq``) and can resume after a crash
without duplicates or gaps. A result is kept as its ``RolloutResult`` JSON (without
``seq``: the column is the truth) and read back validated into the model, its
``seq`` set.

All SQLite work runs on one dedicated thread that owns the connection, so the
event loop never waits on disk.

The schema and the migration of older store files live in ``store.schema``, what a
row reads back as in ``store.rows``, the results table's queries in
``store.summaries``, writing a finished result in ``store.finish``; this module is
the store's interface and its queries.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from rollserve.contract import TERMINAL, ResultSummary, RolloutResult
from rollserve.engine.groups import Outcome
from rollserve.engine.priority import foreground_context
from rollserve.engine.rollout import RolloutSpec
from rollserve.engine.store.batch import DuplicateClientKey, insert_groups, update_statuses
from rollserve.engine.store.finish import current_seq, finish_all
from rollserve.engine.store.reader import Reader
from rollserve.engine.store.rows import (
    COLUMNS,
    GroupRow,
    RolloutRow,
    decode_result,
    rollout_row,
    stored_status,
)
from rollserve.engine.store.schema import connect
from rollserve.engine.store.summaries import SummaryFilter, read_summaries

__all__ = ["DuplicateClientKey", "GroupRow", "RolloutRow", "SQLiteStore", "Store"]

T = TypeVar("T")

STATUS_FLUSH_SECONDS = 0.05


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def create_groups(self, groups: list[tuple[GroupRow, list[RolloutSpec]]]) -> None: ...
    async def group_by_client_key(self, key: str) -> GroupRow | None: ...
    async def set_status(self, rollout_id: str, status: str, attempt: int | None = None) -> None: ...
    async def finish(self, result: RolloutResult) -> int: ...
    async def rollout(self, rollout_id: str, fresh: bool = True) -> RolloutRow | None: ...
    async def group(self, group_id: str, results: bool = True) -> tuple[GroupRow, list[RolloutRow]] | None: ...
    async def group_outcomes(self, group_id: str) -> list[Outcome]: ...
    async def results_after(self, after: int, limit: int) -> list[RolloutResult]: ...
    async def summaries(
        self, where: SummaryFilter, before: int | None, limit: int
    ) -> tuple[list[ResultSummary], int]: ...
    async def unfinished(self) -> list[RolloutRow]: ...
    async def purge(self, finished_before: float) -> int: ...
    async def counts(self) -> dict[str, int]: ...
    async def last_seq(self) -> int: ...
    async def seed_salt(self) -> str: ...
    async def rescore_answer(self, key: str) -> tuple[str, str] | None: ...
    async def keep_rescore_answer(self, key: str, fingerprint: str, answer: str) -> None: ...


class SQLiteStore:
    """The embedded default store: one SQLite file in WAL mode."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollserve-store")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._pending: dict[str, tuple[str, int | None, float]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._finishing: list[tuple[RolloutResult, asyncio.Future[int]]] = []
        self._finisher: asyncio.Task[None] | None = None
        self._reader = Reader.make(self.path)  # point reads, apart from the writer's queue

    # --- plumbing ---------------------------------------------------------------
    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_conn, fn)

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("store is not open")
        with self._conn:  # one transaction per call
            return fn(self._conn)

    def _connect(self) -> None:
        self._conn = connect(self.path)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._connect)

    async def close(self) -> None:
        if self._closed:
            return
        await self.flush()
        if self._finisher is not None:
            await self._finisher  # (the results being written are stored before it closes)
        self._closed = True

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        if self._reader is not None:
            await self._reader.close()
        await loop.run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

    # --- writes -------------------------------------------------------------------
    async def create_groups(self, groups: list[tuple[GroupRow, list[RolloutSpec]]]) -> None:
        """Insert whole groups in one transaction: all of them, or none (one statement
        per table, ``store.batch``)."""
        await self._call(partial(insert_groups, groups=groups, now=time.time()))

    async def set_status(self, rollout_id: str, status: str, attempt: int | None = None) -> None:
        """Record a non-terminal state change.

        Changes are coalesced and written together, a few milliseconds later, in one
        transaction: thousands of rollouts changing stage cost a handful of commits,
        and API reads never queue behind them. Only results must be durable at once
        (``finish``); a lost stage change only means a restart sees an older stage.
        """
        previous = self._pending.get(rollout_id)
        if attempt is None and previous is not None:
            attempt = previous[1]
        self._pending[rollout_id] = (status, attempt, time.time())
        if self._flusher is None or self._flusher.done():
            # Shared by every caller: not a rollout's work even when a rollout starts it (engine.priority).
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon(), context=foreground_context())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(STATUS_FLUSH_SECONDS)
        await self.flush()

    async def flush(self) -> None:
        """Write the coalesced state changes now."""
        if not self._pending:
            return
        batch, self._pending = self._pending, {}

        # (`seq IS NULL` there: a late state change never overwrites a finished result)
        await self._call(partial(update_statuses, changes=batch))

    async def finish(self, result: RolloutResult) -> int:
        """Store the terminal result and give it the next cursor position.

        Idempotent: a rollout that already has a result keeps its first one. Results
        that arrive while others are being written are written together, in one
        transaction, in the order they came (a group commit: thousands of rollouts
        ending at once cost a handful of commits); each caller waits for its own.
        """
        if result.status not in TERMINAL:
            raise ValueError(f"{result.status!r} is not a terminal status")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._finishing.append((result, done))
        if self._finisher is None or self._finisher.done():
            self._finisher = loop.create_task(self._write_finished(), context=foreground_context())
        return await done

    async def _write_finished(self) -> None:
        await asyncio.sleep(0)  # (the results of this turn of the loop join the first batch)
        while self._finishing:
            batch, self._finishing = self._finishing, []
            try:
                answers = await self._call(partial(finish_all, [result for result, _ in batch]))
            except asyncio.CancelledError:  # the loop is ending: nobody stored, nobody waits
                for _, done in batch + self._finishing:
                    done.cancel()
                self._finishing = []
                raise
            except Exception as exc:  # the transaction failed: none of the batch is stored
                answers = [exc] * len(batch)
            for (_, done), answer in zip(batch, answers, strict=True):
                if done.done():
                    continue
                if isinstance(answer, Exception):
                    done.set_exception(answer)
                else:
                    done.set_result(answer)

    async def purge(self, finished_before: float) -> int:
        def _purge(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM rollouts WHERE finished_at IS NOT NULL AND finished_at < ?",
                (finished_before,),
            )
            conn.execute("DELETE FROM groups WHERE NOT EXISTS (SELECT 1 FROM rollouts r WHERE r.group_id = groups.id)")
            conn.execute(
                "DELETE FROM meta WHERE key LIKE ? AND json_extract(value, '$.at') < ?",
                (f"{_RESCORE}%", finished_before),
            )
            return cur.rowcount

        return await self._call(_purge)

    # --- reads ---------------------------------------------------------------------
    async def group_by_client_key(self, key: str) -> GroupRow | None:
        def _get(conn: sqlite3.Connection) -> GroupRow | None:
            row = conn.execute("SELECT * FROM groups WHERE client_key=?", (key,)).fetchone()
            return GroupRow(*row) if row else None

        return await self._call(_get)

    async def rollout(self, rollout_id: str, fresh: bool = True) -> RolloutRow | None:
        """The rollout's row; ``fresh``: with its latest stage change (written first). A
        finished rollout's row needs none (its result was written at once), nor does
        the caller that only wants a result: ``fresh=False`` reads at once, on the
        reader's own thread, never behind the writer's queue."""
        if fresh:
            await self.flush()

        def _get(conn: sqlite3.Connection) -> RolloutRow | None:
            row = conn.execute(f"SELECT {COLUMNS} FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
            return rollout_row(row) if row else None

        return await (self._call(_get) if self._reader is None else self._reader.call(_get))

    async def group(self, group_id: str, results: bool = True) -> tuple[GroupRow, list[RolloutRow]] | None:
        """The group and its rollouts (``results``: with their results, else without)."""
        columns = COLUMNS if results else COLUMNS.replace("result,", "NULL,")

        def _get(conn: sqlite3.Connection) -> tuple[GroupRow, list[RolloutRow]] | None:
            row = conn.execute("SELECT * FROM groups WHERE id=?", (group_id,)).fetchone()
            if row is None:
                return None
            rows = conn.execute(f"SELECT {columns} FROM rollouts WHERE group_id=? ORDER BY id", (group_id,)).fetchall()
            return GroupRow(*row), [rollout_row(r) for r in rows]

        return await self._call(_get)

    async def group_outcomes(self, group_id: str) -> list[Outcome]:
        """Each rollout of the group as its verdict reads it (from the stored columns, not
        the results: cheap for a group of long episodes)."""
        await self.flush()

        def _get(conn: sqlite3.Connection) -> list[Outcome]:
            rows = conn.execute(
                "SELECT id, status, seq, usable, reward, masked FROM rollouts WHERE group_id=? ORDER BY id", (group_id,)
            ).fetchall()
            return [
                Outcome(
                    id=rid,
                    status=stored_status(status),
                    seq=seq,
                    usable=bool(usable),
                    reward=reward,
                    masked=bool(masked),
                )
                for rid, status, seq, usable, reward, masked in rows
            ]

        return await self._call(_get)

    async def results_after(self, after: int, limit: int) -> list[RolloutResult]:
        """Up to ``limit`` results after cursor position ``after``, in order."""

        def _get(conn: sqlite3.Connection) -> list[RolloutResult]:
            rows = conn.execute(
                "SELECT seq, result FROM rollouts WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
            return [decode_result(result, int(seq)) for seq, result in rows]

        return await self._call(_get)

    async def summaries(self, where: SummaryFilter, before: int | None, limit: int) -> tuple[list[ResultSummary], int]:
        """Up to ``limit`` finished results matching ``where``, newest first, with a seq
        below ``before`` (None: from the newest); and how many match in all, counted up
        to ``COUNT_CAP + 1`` (store.summaries). Read from the summary columns, never the
        stored results."""
        return await self._call(lambda conn: read_summaries(conn, where, before, limit))

    async def unfinished(self) -> list[RolloutRow]:
        await self.flush()

        def _get(conn: sqlite3.Connection) -> list[RolloutRow]:
            rows = conn.execute(f"SELECT {COLUMNS} FROM rollouts WHERE seq IS NULL ORDER BY created_at, id").fetchall()
            return [rollout_row(r) for r in rows]

        return await self._call(_get)

    async def counts(self) -> dict[str, int]:
        await self.flush()

        def _get(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall()
            return {status: int(n) for status, n in rows}

        return await self._call(_get)

    async def last_seq(self) -> int:
        def _get(conn: sqlite3.Connection) -> int:
            return current_seq(conn)

        return await self._call(_get)

    async def seed_salt(self) -> str:
        """This store's secret salt for generated instances' seeds (``handlers.seeds``):
        made at the first call, kept for the store's life. INSERT OR IGNORE, then read
        back: two servers opening one store at once agree on the first one written."""

        def _get(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('seed_salt', ?)", (secrets.token_hex(32),))
            row = conn.execute("SELECT value FROM meta WHERE key='seed_salt'").fetchone()
            return str(row[0])

        return await self._call(_get)

    # --- re-scorings' answers, by idempotency key ---------------------------------------
    async def rescore_answer(self, key: str) -> tuple[str, str] | None:
        """The fingerprint and answer (JSON) of the re-scoring done under ``key``, if any."""

        def _get(conn: sqlite3.Connection) -> tuple[str, str] | None:
            row = conn.execute("SELECT value FROM meta WHERE key=?", (_RESCORE + key,)).fetchone()
            if row is None:
                return None
            kept = json.loads(row[0])
            return str(kept["hash"]), str(kept["answer"])

        return await self._call(_get)

    async def keep_rescore_answer(self, key: str, fingerprint: str, answer: str) -> None:
        """Keep the answer of the re-scoring done under ``key`` (purged with the results,
        after the retention)."""
        value = json.dumps({"hash": fingerprint, "answer": answer, "at": time.time()})

        def _put(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (_RESCORE + key, value))

        await self._call(_put)


_RESCORE = "rescore:"  # the meta keys of re-scorings' answers

"""The store's second connection: point reads (a rollout by id) on a thread of their own.

The store's one writing thread also reads pages of results (a thousand results
decoded at a time) and writes group commits of results and stage changes; a
``GET /v1/rollouts/{id}`` queued behind them waited for all of it. In WAL mode a
reader never waits for the writer and sees every committed transaction, so these
reads go to a read-only connection on their own thread. An in-memory store has one
database per connection: there the reads stay on the writer (``None`` from ``make``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Reader:
    """A read-only connection to the store file, used on one thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollserve-store-read")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @classmethod
    def make(cls, path: str) -> Reader | None:
        return None if path == ":memory:" else cls(path)

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("store is not open")
        if self._conn is None:  # opened on first use, once the writer made the schema
            # isolation_level=None: Python's sqlite3 opens no transaction for a SELECT
            # (each statement would see its own snapshot); ``_read`` opens one itself.
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA query_only=ON")
            conn.execute("PRAGMA busy_timeout=5000")
            self._conn = conn
        return self._conn

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connection()
        conn.execute("BEGIN")  # one read transaction: every SELECT in fn sees one snapshot
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")  # (ends the read: the WAL may be checkpointed past it)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._read, fn)

    async def close(self) -> None:
        def _close() -> None:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

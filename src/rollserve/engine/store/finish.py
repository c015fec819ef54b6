"""Writing finished results: each takes the next cursor position (``seq``) and its
summary columns, in the transaction of the batch it came in.

``seq`` is kept in ``meta`` (not ``MAX(seq)``), so purging old results never issues a
cursor position twice. A result already written keeps its ``seq`` (a finish is
idempotent); one that cannot be written is refused alone, its batch going on.
"""

from __future__ import annotations

import sqlite3
import time

from rollserve.contract import RolloutResult
from rollserve.engine.groups import result_usable
from rollserve.engine.store.rows import encode_result

__all__ = ["current_seq", "finish_all", "finish_one", "next_seq"]


def current_seq(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key='seq'").fetchone()
    return int(row[0]) if row else 0


def next_seq(conn: sqlite3.Connection) -> int:
    # Kept in meta (not MAX(seq)) so purging old results never re-issues a cursor.
    seq = current_seq(conn) + 1
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('seq', ?)", (str(seq),))
    return seq


def finish_all(results: list[RolloutResult], conn: sqlite3.Connection) -> list[int | Exception]:
    return [finish_one(conn, result) for result in results]


def finish_one(conn: sqlite3.Connection, result: RolloutResult) -> int | Exception:
    """``finish`` for one result, inside the batch's transaction: its cursor position,
    or the error that refused it alone (no row: ``KeyError``)."""
    try:
        row = conn.execute("SELECT seq FROM rollouts WHERE id=?", (result.id,)).fetchone()
        if row is None:
            raise KeyError(result.id)
        if row[0] is not None:
            return int(row[0])
        # Serialized here, on the store's thread: a result with a long prompt is
        # megabytes of JSON, which would otherwise stall the event loop.
        payload = encode_result(result)
        seq = next_seq(conn)
        now = time.time()
        conn.execute(
            "UPDATE rollouts SET status=?, result=?, seq=?, updated_at=?, finished_at=?,"
            " usable=?, reward=?, masked=?, data_source=?, failure_kind=?, duration=?,"
            " policy_version=? WHERE id=?",
            (
                result.status,
                payload,
                seq,
                now,
                now,
                result_usable(result),
                result.reward,
                result.mask,
                result.data_source,
                None if result.failure is None else result.failure.kind,
                result.timing.total,
                max(result.trajectory.policy_versions, default=None),
                result.id,
            ),
        )
        return seq
    except (KeyError, ValueError, TypeError) as exc:
        return exc

"""Writing many rows in one statement: a submitted batch's groups and rollouts, and
the coalesced state changes.

SQLite's Python module lets go of the GIL around every step of a statement, and
``executemany`` steps once a row: on a store thread beside a busy event loop, each
row then waits for the loop's thread to hand the GIL back (up to the interpreter's
switch interval, 5 ms), so a batch of 1,000 rows took seconds of wall time while the
loop ran other work. Here a batch is one JSON array, bound as one parameter and read
by ``json_each`` in one ``INSERT ... SELECT`` (or ``UPDATE``): one step per table,
whatever the batch's size. The rows and their order are what row-by-row inserts
would write; a taken client key still fails the whole transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from rollserve.engine.rollout import RolloutSpec
from rollserve.engine.store.rows import GroupRow

__all__ = ["DuplicateClientKey", "insert_groups", "update_statuses"]


class DuplicateClientKey(Exception):
    """Another group already holds this client-chosen id."""


_INSERT_GROUPS = """
INSERT INTO groups (id, task_id, client_key, request_hash, n, created_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
FROM json_each(?) ORDER BY key
"""

_INSERT_ROLLOUTS = """
INSERT INTO rollouts (id, group_id, spec, status, attempt, created_at, updated_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       'queued', 1, ?1, ?1
FROM json_each(?2) ORDER BY key
"""


def insert_groups(
    conn: sqlite3.Connection, groups: Sequence[tuple[GroupRow, Sequence[RolloutSpec]]], now: float
) -> None:
    """Insert ``groups`` and their rollouts (status ``queued``, attempt 1) inside the
    caller's transaction. Raises ``DuplicateClientKey`` naming a client key another
    group holds (the transaction's rows are then rolled back by the caller's ``with``)."""
    group_rows = [[g.id, g.task_id, g.client_key, g.request_hash, g.n, g.created_at] for g, _ in groups]
    try:
        conn.execute(_INSERT_GROUPS, (json.dumps(group_rows),))
    except sqlite3.IntegrityError as exc:
        raise DuplicateClientKey(_taken(conn, [g for g, _ in groups])) from exc
    rollout_rows = [[s.id, g.id, s.model_dump_json()] for g, specs in groups for s in specs]
    conn.execute(_INSERT_ROLLOUTS, (now, json.dumps(rollout_rows)))


def _taken(conn: sqlite3.Connection, groups: list[GroupRow]) -> str:
    """The first of ``groups``' client keys (or ids) already stored, for the error."""
    for group in groups:
        if group.client_key is not None:
            found = conn.execute("SELECT 1 FROM groups WHERE client_key=?", (group.client_key,)).fetchone()
        else:
            found = conn.execute("SELECT 1 FROM groups WHERE id=?", (group.id,)).fetchone()
        if found:
            return group.client_key or group.id
    keys = [g.client_key for g in groups if g.client_key is not None]
    return keys[0] if keys else groups[0].id  # (two of the batch's own: the API refuses that first)


# (``+rollouts.seq``: not by the seq index, which would walk every unfinished row for
# each change; each change finds its row by id)
_UPDATE_STATUSES = """
UPDATE rollouts SET
    status = json_extract(c.value, '$[1]'),
    attempt = COALESCE(json_extract(c.value, '$[2]'), rollouts.attempt),
    updated_at = json_extract(c.value, '$[3]')
FROM json_each(?) AS c
WHERE rollouts.id = json_extract(c.value, '$[0]') AND +rollouts.seq IS NULL
"""


def update_statuses(conn: sqlite3.Connection, changes: dict[str, tuple[str, int | None, float]]) -> None:
    """Write coalesced state changes (rollout id -> status, attempt or None to keep
    it, time) in one statement; a finished rollout (``seq`` set) keeps its status."""
    if sqlite3.sqlite_version_info < (3, 33):  # (no UPDATE ... FROM): a statement a row
        conn.executemany(
            "UPDATE rollouts SET status=?, attempt=COALESCE(?, attempt), updated_at=? WHERE id=? AND seq IS NULL",
            [(status, attempt, at, rid) for rid, (status, attempt, at) in changes.items()],
        )
        return
    rows = [[rid, status, attempt, at] for rid, (status, attempt, at) in changes.items()]
    conn.execute(_UPDATE_STATUSES, (json.dumps(rows),))

"""The store's schema, and the migration of a store file made by an older rollserve:
the tables, the columns added since the first release and their backfill, and the
summary indexes (``summaries``), all at open, in one transaction."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rollserve.engine.store import summaries

SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    client_key TEXT UNIQUE,
    request_hash TEXT NOT NULL,
    n INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY,
    group_id TEXT NOT NULL REFERENCES groups(id),
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    result TEXT,
    seq INTEGER UNIQUE,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,
    usable INTEGER,
    reward REAL,
    masked INTEGER,
    data_source TEXT,
    failure_kind TEXT,
    duration REAL,
    policy_version INTEGER
);
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts(group_id);
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Columns added after the first release: a store file made before them gets them at
# open, and its finished rows are filled in from their stored results.
_ADDED_COLUMNS = {
    "usable": "INTEGER",
    "reward": "REAL",
    "masked": "INTEGER",
    "data_source": "TEXT",
    "failure_kind": "TEXT",
    "duration": "REAL",
    "policy_version": "INTEGER",
}
_BACKFILL = """
UPDATE rollouts SET
    reward = json_extract(result, '$.reward'),
    masked = COALESCE(json_extract(result, '$.mask'), 1),
    usable = (status IN ('completed', 'failed') AND json_extract(result, '$.mask') = 0
              AND json_extract(result, '$.reward') IS NOT NULL)
WHERE result IS NOT NULL AND usable IS NULL
"""


def migrate(conn: sqlite3.Connection) -> None:
    """Add the columns and indexes a store file made by an older rollserve lacks, and
    fill them in, in one transaction (SQLite DDL is transactional): a crash or an error
    part-way leaves the file as it was, and the next open does it all again (were the
    columns committed before their backfill, old rows would keep them empty forever).
    ``conn`` is in autocommit mode (isolation_level None): the BEGIN here is the only
    transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        present = {row[1] for row in conn.execute("PRAGMA table_info(rollouts)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in present:
                conn.execute(f"ALTER TABLE rollouts ADD COLUMN {name} {kind}")
        conn.execute(_BACKFILL)
        if "data_source" not in present:  # only once: the scan reads every stored result
            conn.execute(summaries.BACKFILL_SUMMARY)
        for name in summaries.RETIRED_INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        for index in summaries.SUMMARY_INDEXES:
            conn.execute(index)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def connect(path: str) -> sqlite3.Connection:
    """A connection to the store file at ``path`` (made if missing), in WAL mode, its
    schema created or migrated, in implicit-transaction mode (``with conn``)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a committed transaction survives a process crash
    # (SIGKILL); only an OS crash can lose the last few.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    try:
        conn.executescript(SCHEMA)
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    conn.isolation_level = "DEFERRED"  # back to implicit transactions for `with conn`
    return conn

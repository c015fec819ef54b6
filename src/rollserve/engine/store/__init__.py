"""The store: every rollout's spec, state and result in SQLite (WAL), durable across
a crash.

- ``sqlite``: the interface the engine uses (``Store``) and its SQLite implementation
  (``SQLiteStore``): writes, reads, the results cursor, all on one thread that owns
  the connection.
- ``schema``: the tables, and the migration of a store file an older rollserve made,
  at open.
- ``rows``: what a stored row reads back as (``RolloutRow``, ``GroupRow``).
- ``summaries``: the results table's rows (``SummaryFilter``), read from summary
  columns and an index, never from the stored results.

The names the rest of rollserve uses are imported here.
"""

from rollserve.engine.store.rows import GroupRow, RolloutRow
from rollserve.engine.store.sqlite import DuplicateClientKey, SQLiteStore, Store
from rollserve.engine.store.summaries import COUNT_CAP, SummaryFilter

__all__ = ["COUNT_CAP", "DuplicateClientKey", "GroupRow", "RolloutRow", "SQLiteStore", "Store", "SummaryFilter"]

"""The results table's side of the store: finished results as rows (``ResultSummary``),
filtered and counted from summary columns the store writes at ``finish`` and covering
indexes over them, never from the stored results (only a page's own rows are read)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from rollserve.contract import FailureFilter, ResultSummary, TerminalStatus

# The summary columns, for results stored before them (run once, when they are added).
BACKFILL_SUMMARY = """
UPDATE rollouts SET
    data_source = json_extract(result, '$.data_source'),
    failure_kind = json_extract(result, '$.failure.kind'),
    duration = json_extract(result, '$.timing.total'),
    policy_version = (SELECT MAX(value) FROM json_each(result, '$.trajectory.policy_versions'))
WHERE result IS NOT NULL AND data_source IS NULL
"""
# The table filters and counts from these indexes alone, never reading a row: each holds
# every column a filter reads (covering). The first walks every finished result in seq
# order; the others serve a data_source or a status filter (a rare one is found without
# walking past all the others), whatever else the filter asks for (masked, failure kind).
SUMMARY_INDEXES = (
    """CREATE INDEX IF NOT EXISTS rollouts_finished
    ON rollouts(seq, data_source, status, masked, failure_kind) WHERE seq IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS rollouts_finished_by_source
    ON rollouts(data_source, seq, status, masked, failure_kind) WHERE seq IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS rollouts_finished_by_status
    ON rollouts(status, seq, data_source, masked, failure_kind) WHERE seq IS NOT NULL""",
)
# Indexes an older rollserve made that the ones above replace: dropped at open.
RETIRED_INDEXES = ("rollouts_finished_source", "rollouts_finished_status")
# A page counts its matches up to here and no further (counting all of millions on every
# page load would walk the whole index): the page's total is then "at least this many".
COUNT_CAP = 10_000


@dataclass(frozen=True)
class SummaryFilter:
    """Which finished results a page of summaries holds (None: any)."""

    data_source: str | None = None
    status: TerminalStatus | None = None
    masked: bool | None = None
    failure_kind: FailureFilter | None = None  # "none": no failure

    def where(self) -> tuple[str, list[str | int]]:
        """The SQL condition and its arguments."""
        clauses, args = ["seq IS NOT NULL"], list[str | int]()
        if self.data_source is not None:
            clauses.append("data_source = ?")
            args.append(self.data_source)
        if self.status is not None:
            clauses.append("status = ?")
            args.append(self.status)
        if self.masked is not None:
            clauses.append("masked = ?")
            args.append(int(self.masked))
        if self.failure_kind == "none":
            clauses.append("failure_kind IS NULL")
        elif self.failure_kind is not None:
            clauses.append("failure_kind = ?")
            args.append(self.failure_kind)
        return " AND ".join(clauses), args


def read_summaries(
    conn: sqlite3.Connection, where: SummaryFilter, before: int | None, limit: int
) -> tuple[list[ResultSummary], int]:
    """Up to ``limit`` rows matching ``where`` with a seq below ``before`` (None: from the
    newest), newest first; and how many match in all, counted up to ``COUNT_CAP + 1``
    (more than ``COUNT_CAP``: at least that many)."""
    clause, args = where.where()
    (total,) = conn.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM rollouts WHERE {clause} LIMIT ?)", [*args, COUNT_CAP + 1]
    ).fetchone()
    if before is not None:
        clause, args = clause + " AND seq < ?", [*args, before]
    rows = conn.execute(
        "SELECT seq, id, group_id, data_source, status, reward, masked, failure_kind,"
        f" policy_version, duration, finished_at FROM rollouts WHERE {clause}"
        " ORDER BY seq DESC LIMIT ?",
        [*args, limit],
    ).fetchall()
    return [
        ResultSummary(
            seq=seq,
            id=rid,
            group_id=gid,
            data_source=source or "",
            status=status,
            reward=reward,
            masked=bool(masked),
            failure_kind=kind,
            policy_version=version,
            duration=duration,
            finished_at=finished,
        )
        for seq, rid, gid, source, status, reward, masked, kind, version, duration, finished in rows
    ], int(total)

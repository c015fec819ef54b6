"""The results table's rows: filtered and paged from the summary columns; a store file
made before those columns gets them filled in from its stored results at open."""

import sqlite3

import pytest

from rollserve.contract import Failure
from rollserve.engine.store import SQLiteStore
from rollserve.engine.store import summaries as store_summaries
from rollserve.engine.store.summaries import BACKFILL_SUMMARY, SummaryFilter
from tests.engine.test_store import _group, _result


async def _fill(store: SQLiteStore) -> None:
    await store.create_groups([_group("g1", 4)])
    ok = _result("g1-0", reward=1.0)
    wrong = _result("g1-1", "failed", reward=0.0)
    wrong.failure = Failure(stage="run", kind="agent", message="no answer")
    infra = _result("g1-2", "failed")
    infra.failure, infra.mask = Failure(stage="init", kind="infra", message="sandbox"), True
    late = _result("g1-3", "timed_out")
    late.failure, late.mask = Failure(stage="run", kind="timeout", message="run"), True
    late.timing.total = 2.5
    late.trajectory.policy_versions = [3, 4]
    for result in (ok, wrong, infra, late):
        await store.finish(result)


@pytest.mark.parametrize(
    ("where", "ids"),
    [
        (SummaryFilter(), ["g1-3", "g1-2", "g1-1", "g1-0"]),
        (SummaryFilter(masked=True), ["g1-3", "g1-2"]),
        (SummaryFilter(masked=False), ["g1-1", "g1-0"]),
        (SummaryFilter(failure_kind="none"), ["g1-0"]),
        (SummaryFilter(failure_kind="infra"), ["g1-2"]),
        (SummaryFilter(status="failed", failure_kind="agent"), ["g1-1"]),
        (SummaryFilter(data_source="math", status="timed_out"), ["g1-3"]),
        (SummaryFilter(data_source="code"), []),
    ],
)
async def test_summaries_filter(tmp_path, where, ids):
    store = SQLiteStore(tmp_path / "r.db")
    await store.open()
    try:
        await _fill(store)
        rows, total = await store.summaries(where, None, 10)
        assert [r.id for r in rows] == ids and total == len(ids)
    finally:
        await store.close()


async def test_summaries_page_newest_first_and_a_store_from_before_is_filled_in(tmp_path):
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    await store.open()
    await _fill(store)
    rows, total = await store.summaries(SummaryFilter(), None, 2)
    assert [r.seq for r in rows] == [4, 3] and total == 4
    rows, _ = await store.summaries(SummaryFilter(), 3, 10)
    assert [r.seq for r in rows] == [2, 1]
    await store.close()

    _as_before_the_summary_columns(path)

    store = SQLiteStore(path)
    await store.open()
    try:
        rows, total = await store.summaries(SummaryFilter(failure_kind="timeout"), None, 10)
        assert total == 1
        (late,) = rows
        assert (
            late.id,
            late.data_source,
            late.status,
            late.masked,
            late.failure_kind,
            late.duration,
            late.policy_version,
        ) == ("g1-3", "math", "timed_out", True, "timeout", 2.5, 4)
        rows, total = await store.summaries(SummaryFilter(failure_kind="none"), None, 10)
        assert [(r.id, r.reward) for r in rows] == [("g1-0", 1.0)] and total == 1
    finally:
        await store.close()


def _as_before_the_summary_columns(path) -> None:
    """Make the file as an older rollserve left it: no summary columns, no indexes."""
    conn = sqlite3.connect(path)
    for index in ("rollouts_finished", "rollouts_finished_by_source", "rollouts_finished_by_status"):
        conn.execute(f"DROP INDEX IF EXISTS {index}")
    for column in ("data_source", "failure_kind", "duration", "policy_version"):
        conn.execute(f"ALTER TABLE rollouts DROP COLUMN {column}")
    conn.commit()
    conn.close()


async def test_a_failed_migration_leaves_the_file_as_it_was_and_the_next_open_completes_it(tmp_path, monkeypatch):
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    await store.open()
    await _fill(store)
    await store.close()
    _as_before_the_summary_columns(path)

    # The backfill fails part-way (here: on malformed JSON, after the columns were added).
    monkeypatch.setattr(
        store_summaries,
        "BACKFILL_SUMMARY",
        BACKFILL_SUMMARY.replace("json_extract(result, '$.timing.total')", "json_extract('{', '$')"),
    )
    broken = SQLiteStore(path)
    with pytest.raises(sqlite3.OperationalError, match="malformed JSON"):
        await broken.open()
    await broken.close()
    conn = sqlite3.connect(path)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(rollouts)")}
    conn.close()
    assert "data_source" not in columns  # rolled back with the backfill

    monkeypatch.undo()
    store = SQLiteStore(path)
    await store.open()
    try:
        rows, total = await store.summaries(SummaryFilter(data_source="math"), None, 10)
        assert total == 4 and {r.data_source for r in rows} == {"math"}
        rows, total = await store.summaries(SummaryFilter(failure_kind="timeout"), None, 10)
        assert [(r.id, r.duration) for r in rows] == [("g1-3", 2.5)]
    finally:
        await store.close()


async def test_a_data_source_or_status_filter_reads_its_own_index_and_nothing_else(tmp_path):
    store = SQLiteStore(tmp_path / "r.db")
    await store.open()
    await store.close()
    conn = sqlite3.connect(tmp_path / "r.db")
    try:
        for where, index in (
            (SummaryFilter(data_source="math"), "rollouts_finished_by_source"),
            (SummaryFilter(data_source="math", masked=True), "rollouts_finished_by_source"),
            (SummaryFilter(data_source="math", failure_kind="none"), "rollouts_finished_by_source"),
            (SummaryFilter(status="failed"), "rollouts_finished_by_status"),
            (SummaryFilter(status="failed", masked=False, failure_kind="agent"), "rollouts_finished_by_status"),
        ):
            clause, args = where.where()
            plan = " ".join(
                str(row)
                for row in conn.execute(
                    f"EXPLAIN QUERY PLAN SELECT COUNT(*) FROM (SELECT 1 FROM rollouts WHERE {clause} LIMIT 10001)", args
                )
            )
            # Counted from the index alone: no row (and no stored result) is read.
            assert f"COVERING INDEX {index} " in plan, (where, plan)
    finally:
        conn.close()


async def test_the_indexes_an_older_rollserve_made_are_replaced_at_open(tmp_path):
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    await store.open()
    await _fill(store)
    await store.close()
    conn = sqlite3.connect(path)
    for index in ("rollouts_finished_by_source", "rollouts_finished_by_status"):
        conn.execute(f"DROP INDEX {index}")
    conn.execute("CREATE INDEX rollouts_finished_source ON rollouts(data_source, seq) WHERE seq IS NOT NULL")
    conn.execute("CREATE INDEX rollouts_finished_status ON rollouts(status, seq) WHERE seq IS NOT NULL")
    conn.commit()
    conn.close()

    store = SQLiteStore(path)
    await store.open()
    try:
        rows, total = await store.summaries(SummaryFilter(data_source="math", masked=True), None, 10)
        assert total == 2 and [r.id for r in rows] == ["g1-3", "g1-2"]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        names = {
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND name LIKE 'rollouts_finished%'"
            )
        }
    finally:
        conn.close()
    assert names == {"rollouts_finished", "rollouts_finished_by_source", "rollouts_finished_by_status"}

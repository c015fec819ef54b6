"""A batch's rows written in one statement (``store.batch``): the rows a row-by-row
insert wrote, in order; a taken client key refuses the whole batch, naming the key;
coalesced state changes never touch a finished rollout."""

import time

import pytest

from rollserve.engine.rollout import RolloutSpec
from rollserve.engine.store import DuplicateClientKey, GroupRow, SQLiteStore
from rollserve.engine.store import batch as store_batch
from rollserve.engine.store.schema import connect
from tests.engine.test_store import _group, _result


def _spec(gid: str, i: int) -> RolloutSpec:
    return RolloutSpec(
        id=f"{gid}-{i}",
        group_id=gid,
        task_id=gid,
        data_source="math",
        sample_index=i,
        instance={"question": 'quote " backslash \\ newline \n é 中', "answer": "2", "nested": [1, 2.5, None]},
        metadata={"k": True},
    )


def test_the_rows_are_those_of_a_row_by_row_insert_in_order(tmp_path):
    conn = connect(str(tmp_path / "s.db"))
    groups = [
        (
            GroupRow(f"g{j}", f"t{j}", None if j % 2 else f"key{j}", f"h{j}", 3, 1000.5 + j),
            [_spec(f"g{j}", i) for i in range(3)],
        )
        for j in range(50)
    ]
    with conn:
        store_batch.insert_groups(conn, groups, now=2000.25)
    stored = conn.execute(
        "SELECT id, task_id, client_key, request_hash, n, created_at FROM groups ORDER BY rowid"
    ).fetchall()
    assert stored == [(g.id, g.task_id, g.client_key, g.request_hash, g.n, g.created_at) for g, _ in groups]
    rows = conn.execute(
        "SELECT id, group_id, spec, status, attempt, created_at, updated_at, seq FROM rollouts ORDER BY rowid"
    ).fetchall()
    expected = [
        (s.id, g.id, s.model_dump_json(), "queued", 1, 2000.25, 2000.25, None) for g, specs in groups for s in specs
    ]
    assert rows == expected
    assert RolloutSpec.model_validate_json(rows[0][2]) == groups[0][1][0]
    assert conn.execute(
        "SELECT typeof(g.n), typeof(g.created_at), typeof(r.attempt) FROM groups g, rollouts r LIMIT 1"
    ).fetchone() == (
        "integer",
        "real",
        "integer",
    )


async def test_a_taken_key_refuses_the_whole_batch_naming_the_key(tmp_path):
    store = SQLiteStore(tmp_path / "r.db")
    await store.open()
    try:
        await store.create_groups([_group("g1", 1, key="k1")])
        with pytest.raises(DuplicateClientKey, match="^k1$"):
            await store.create_groups(
                [_group("g2", 2, key="k2"), _group("g3", 1), _group("g4", 1, key="k9"), _group("g5", 1, key="k1")]
            )
        with pytest.raises(DuplicateClientKey) as caught:
            await store.create_groups([_group("g6", 2, key="k6"), _group("g1", 1)])
        assert str(caught.value) == "g1"  # (a group id taken: named by the id)
        for gid in ("g2", "g3", "g4", "g5", "g6"):
            assert await store.group(gid) is None
        assert [r.id for r in await store.unfinished()] == ["g1-0"]
    finally:
        await store.close()


@pytest.mark.parametrize("old_sqlite", [False, True])
async def test_state_changes_land_by_id_and_never_move_a_finished_rollout(tmp_path, monkeypatch, old_sqlite):
    if old_sqlite:  # the statement-a-row path a SQLite without UPDATE ... FROM takes
        monkeypatch.setattr(store_batch.sqlite3, "sqlite_version_info", (3, 31, 1))
    store = SQLiteStore(tmp_path / "r.db")
    await store.open()
    try:
        await store.create_groups([_group("g1", 3), _group("g2", 2)])
        assert await store.finish(_result("g1-1")) == 1
        await store.set_status("g1-0", "run")
        await store.set_status("g1-1", "run")  # finished: stays completed
        await store.set_status("g2-0", "queued", attempt=2)
        await store.set_status("g2-0", "init")  # the attempt set before is kept
        await store.set_status("nobody", "run")  # no such row: nothing happens
        await store.flush()
        got = {
            r.id: (r.status, r.attempt)
            for r in [await store.rollout(i) for i in ("g1-0", "g1-1", "g1-2", "g2-0", "g2-1")]
        }
        assert got == {
            "g1-0": ("run", 1),
            "g1-1": ("completed", 1),
            "g1-2": ("queued", 1),
            "g2-0": ("init", 2),
            "g2-1": ("queued", 1),
        }
    finally:
        await store.close()


def test_a_change_is_found_by_id_not_by_walking_the_unfinished_rows(tmp_path):
    conn = connect(str(tmp_path / "s.db"))
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + store_batch._UPDATE_STATUSES, ("[]",)))
    assert "SEARCH rollouts USING INDEX sqlite_autoindex_rollouts_1 (id=?)" in plan, plan
    assert "seq" not in plan, plan


def test_a_batch_is_one_statement_per_table(tmp_path):
    conn = connect(str(tmp_path / "s.db"))
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    with conn:
        store_batch.insert_groups(conn, [_group(f"g{j}", 4) for j in range(100)], now=time.time())
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    assert len(inserts) == 2, inserts
    assert conn.execute("SELECT count(*) FROM rollouts").fetchone() == (400,)

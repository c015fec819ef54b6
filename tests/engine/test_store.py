import time

import pytest

from rollserve.contract import RolloutResult
from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.engine.store import DuplicateClientKey, GroupRow, SQLiteStore


def _group(gid: str, n: int = 2, key: str | None = None):
    group = GroupRow(gid, f"task-{gid}", key, "hash", n, time.time())
    specs = [
        RolloutSpec(
            id=f"{gid}-{i}",
            group_id=gid,
            task_id=group.task_id,
            data_source="math",
            sample_index=i,
            instance={"question": "1+1", "answer": "2"},
        )
        for i in range(n)
    ]
    return group, specs


def _result(rollout_id: str, status: str = "completed", reward: float | None = None) -> RolloutResult:
    gid = rollout_id.rsplit("-", 1)[0]
    spec = RolloutSpec(
        id=rollout_id,
        group_id=gid,
        task_id=f"task-{gid}",
        data_source="math",
        sample_index=int(rollout_id.rsplit("-", 1)[1]),
        instance={},
    )
    return Rollout(spec=spec, status=status, reward=reward).result()


@pytest.fixture
async def store(tmp_path):
    s = SQLiteStore(tmp_path / "r.db")
    await s.open()
    yield s
    await s.close()


async def test_results_come_back_in_completion_order_through_the_cursor(store):
    await store.create_groups([_group("g1", 3)])
    assert await store.finish(_result("g1-2")) == 1
    assert await store.finish(_result("g1-0", "failed")) == 2
    rows = await store.results_after(0, 10)
    assert [(r.seq, r.id, r.status) for r in rows] == [(1, "g1-2", "completed"), (2, "g1-0", "failed")]
    assert await store.results_after(2, 10) == []
    assert [r.id for r in await store.unfinished()] == ["g1-1"]


async def test_finish_is_idempotent_and_never_reissues_a_cursor(store):
    await store.create_groups([_group("g1", 2)])
    first = _result("g1-0", reward=1.0)
    assert await store.finish(first) == 1
    assert await store.finish(_result("g1-0", reward=0.0)) == 1
    row = await store.rollout("g1-0")
    assert row.result == first.model_copy(update={"seq": 1}) and row.status == "completed"
    # set_status after the result is written must not move it back
    await store.set_status("g1-0", "run")
    assert (await store.rollout("g1-0")).status == "completed"
    removed = await store.purge(time.time() + 1)
    assert removed == 1
    assert await store.finish(_result("g1-1")) == 2


async def test_a_batch_is_stored_whole_or_not_at_all(store):
    await store.create_groups([_group("g1", 1, key="k1")])
    with pytest.raises(DuplicateClientKey):
        await store.create_groups([_group("g2", 1), _group("g3", 1, key="k1")])
    assert await store.group("g2") is None
    assert (await store.group_by_client_key("k1")).id == "g1"


async def test_state_survives_reopening(tmp_path):
    path = tmp_path / "r.db"
    s = SQLiteStore(path)
    await s.open()
    await s.create_groups([_group("g1", 2)])
    await s.finish(_result("g1-0", reward=1.0))
    await s.set_status("g1-1", "run")
    await s.close()
    s2 = SQLiteStore(path)
    await s2.open()
    try:
        assert (await s2.rollout("g1-0")).result.reward == 1.0
        (row,) = await s2.unfinished()
        assert row.id == "g1-1" and row.status == "run"
        assert row.spec.instance == {"question": "1+1", "answer": "2"}
        assert await s2.counts() == {"completed": 1, "run": 1}
    finally:
        await s2.close()


async def test_a_result_reads_back_as_stored_and_a_group_reads_without_results(store):
    await store.create_groups([_group("g1", 2)])
    stored = _result("g1-1", reward=0.5)
    stored.trajectory.messages = []
    await store.finish(stored)
    (back,) = await store.results_after(0, 10)
    assert back == stored.model_copy(update={"seq": 1})  # validated into the model, with its seq
    _, rows = await store.group("g1", results=False)
    assert [(r.id, r.status, r.seq, r.result) for r in rows] == [
        ("g1-0", "queued", None, None),
        ("g1-1", "completed", 1, None),
    ]
    _, rows = await store.group("g1")
    assert rows[1].result == back


async def test_only_a_finished_rollout_has_a_result(store):
    await store.create_groups([_group("g1", 1)])
    spec = (await store.unfinished())[0].spec
    with pytest.raises(ValueError, match="not finished"):
        Rollout(spec=spec, status="run").result()


async def test_a_store_file_from_before_the_group_columns_gets_them_filled_in(tmp_path):
    """A store made before rollouts had usable/reward/masked columns: opened, it gets
    them, and its finished rows read as their stored results say."""
    import sqlite3

    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.open()
    await store.create_groups([_group("g1", 3)])
    await store.finish(_result("g1-0", reward=1.0))
    await store.finish(_result("g1-1", "failed", reward=0.0))
    await store.close()
    conn = sqlite3.connect(path)  # back to the old schema: the three columns dropped
    # (the results table's indexes came later)
    for index in ("rollouts_finished", "rollouts_finished_by_source", "rollouts_finished_by_status"):
        conn.execute(f"DROP INDEX {index}")
    for column in ("usable", "reward", "masked"):
        conn.execute(f"ALTER TABLE rollouts DROP COLUMN {column}")
    conn.commit()
    conn.close()

    store = SQLiteStore(path)
    await store.open()
    try:
        outcomes = {o.id: o for o in await store.group_outcomes("g1")}
        assert outcomes["g1-0"].usable and outcomes["g1-0"].reward == 1.0
        assert outcomes["g1-1"].usable and not outcomes["g1-1"].masked
        assert not outcomes["g1-2"].usable and outcomes["g1-2"].seq is None
    finally:
        await store.close()


async def test_a_rescore_answer_is_kept_by_key_across_reopening_and_purged_with_retention(tmp_path):
    path = tmp_path / "r.db"
    s = SQLiteStore(path)
    await s.open()
    assert await s.rescore_answer("k") is None
    await s.keep_rescore_answer("k", "h1", '{"scoring": "outcome", "results": []}')
    await s.close()
    s = SQLiteStore(path)
    await s.open()
    try:
        assert await s.rescore_answer("k") == ("h1", '{"scoring": "outcome", "results": []}')
        salt = await s.seed_salt()  # (the other meta rows are not a rescore's)
        await s.purge(time.time() - 60)  # kept within the retention
        assert await s.rescore_answer("k") is not None
        await s.purge(time.time() + 1)
        assert await s.rescore_answer("k") is None
        assert await s.seed_salt() == salt
    finally:
        await s.close()


async def test_results_ending_together_are_written_together_each_once_in_order(store):
    """Results that arrive at once share a transaction: each gets its own cursor, in
    the order they came; one that cannot be stored fails alone; a second result for
    the same rollout in the same batch keeps the first one's cursor."""
    import asyncio

    await store.create_groups([_group("g1", 50)])
    commits = []
    real_call = store._call

    async def counting_call(fn):
        commits.append(fn)
        return await real_call(fn)

    store._call = counting_call
    ids = [f"g1-{i}" for i in range(50)]
    answers = await asyncio.gather(
        *[store.finish(_result(i)) for i in ids],
        store.finish(_result("nope-0")),
        store.finish(_result("g1-3", "failed")),
        return_exceptions=True,
    )
    assert answers[:50] == list(range(1, 51))
    assert isinstance(answers[50], KeyError)
    assert answers[51] == 4  # (g1-3's first result, in the same batch)
    assert len(commits) < 10  # (52 results: a handful of transactions, not one each)
    rows = await store.results_after(0, 100)
    assert [(r.seq, r.id) for r in rows] == [(i + 1, rid) for i, rid in enumerate(ids)]
    assert (await store.rollout("g1-3")).status == "completed"

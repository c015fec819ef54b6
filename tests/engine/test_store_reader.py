"""A finished rollout's row is read on the store's reader connection, never behind the
writer's queue: with the writer's thread held, ``rollout(id, fresh=False)`` and
``GET /v1/rollouts/{id}`` of a finished rollout still answer; a fresh read waits for
the writer (it writes the stage changes first); an in-memory store reads on the writer."""

import asyncio
import sqlite3
import threading

from rollserve.engine.store import GroupRow, SQLiteStore
from tests.engine.test_store import _group, _result


def hold_writer(store: SQLiteStore) -> threading.Event:
    """Block the store's writing thread until the returned event is set."""
    release = threading.Event()
    store._executor.submit(release.wait, 120)
    return release


async def test_a_finished_row_is_read_while_the_writer_is_busy(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    try:
        await store.create_groups([_group("g1")])
        await store.finish(_result("g1-0", reward=1.0))
        release = hold_writer(store)
        try:
            async with asyncio.timeout(60):  # (a bound: on the writer it would wait 120 s)
                row = await store.rollout("g1-0", fresh=False)
            assert row.status == "completed" and row.result.reward == 1.0 and row.seq == 1
            assert await store.rollout("nope", fresh=False) is None
            await store.set_status("g1-1", "run")
            fresh = asyncio.ensure_future(store.rollout("g1-1"))  # flushes on the writer first
            done, _ = await asyncio.wait([fresh], timeout=0.5)
            assert not done
        finally:
            release.set()
        assert (await fresh).status == "run"
    finally:
        await store.close()


async def test_one_read_sees_one_snapshot_while_the_writer_commits(tmp_path):
    """Every SELECT of one reader call sees the same snapshot, even when a write is
    committed between two of them (Python's sqlite3 alone would start no transaction)."""
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    try:
        await store.create_groups([_group("g3")])
        assert store._reader is not None
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None, check_same_thread=False)  # another writer

        def two_counts(conn: sqlite3.Connection) -> tuple[int, int, int]:
            first = conn.execute("SELECT count(*) FROM meta").fetchone()[0]
            other.execute("INSERT INTO meta VALUES ('probe', 'x')")  # committed at once (autocommit)
            outside = other.execute("SELECT count(*) FROM meta").fetchone()[0]
            second = conn.execute("SELECT count(*) FROM meta").fetchone()[0]
            return first, outside, second

        try:
            first, outside, second = await store._reader.call(two_counts)
        finally:
            other.close()
        assert outside == first + 1
        assert second == first  # the write came after this read's snapshot
    finally:
        await store.close()


async def test_an_in_memory_store_reads_on_its_writer():
    store = SQLiteStore(":memory:")
    await store.open()
    try:
        assert store._reader is None
        group, specs = _group("g2")
        assert isinstance(group, GroupRow)
        await store.create_groups([(group, specs)])
        await store.finish(_result("g2-0"))
        assert (await store.rollout("g2-0", fresh=False)).status == "completed"
    finally:
        await store.close()


async def test_get_of_a_finished_rollout_answers_while_the_writer_is_held(make_api, tok):
    from rollserve.testing import FakeVLLM

    async with FakeVLLM(tok, replies="\\boxed{4}") as server:
        service, client = await make_api([server.url])
        body = {"tasks": [{"data_source": "math", "instance": {"question": "2+2?", "answer": "4"}}]}
        (rid,) = (await client.post("/v1/rollouts", json=body)).json()["groups"][0]["rollout_ids"]
        assert (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()["done"] is True
        release = hold_writer(service.engine.store)
        try:
            async with asyncio.timeout(60):  # (held on the writer, it would wait for the release below)
                got = (await client.get(f"/v1/rollouts/{rid}")).json()
            assert got["status"] == "completed" and got["result"]["reward"] == 1.0
        finally:
            release.set()

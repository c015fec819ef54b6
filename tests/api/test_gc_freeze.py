"""``--gc-freeze`` (the default): once started, the server freezes the heap its start-up
made (``api.serving.freeze_startup_heap``), so that full collections no longer walk it.
What rollouts make afterwards must still be collected, cycles included: here each task
the server makes while rollouts run and are cancelled through the API holds a cycle of
its own, and after a freeze each is still freed by a collection."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pydantic
import pytest

from rollserve.api.serving import freeze_startup_heap, set_young_threshold
from rollserve.server import ServerConfig
from tests.waiting import eventually

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


@pytest.fixture
def frozen_heap():
    """The freeze as the server does it once started; undone after the test (it is
    process-wide), with automatic collection as it was."""
    was_enabled, thresholds = gc.isenabled(), gc.get_threshold()
    try:
        yield freeze_startup_heap
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def test_the_freeze_takes_the_startup_heap_out_of_full_collections(frozen_heap):
    made_before = [object() for _ in range(10)]
    kept_before = {"made before": made_before}
    frozen = frozen_heap()
    assert frozen == gc.get_freeze_count() > 0
    tracked = {id(o) for o in gc.get_objects()}
    assert id(kept_before) not in tracked  # frozen: no generation holds it

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after the freeze
    assert id(a) in {id(o) for o in gc.get_objects()}
    dead = weakref.ref(a)
    del a, b
    assert dead() is not None  # reference counting alone cannot free a cycle
    gc.collect()
    assert dead() is None


class Cycle:
    """Refers to itself: once its rollout's task is done, only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


def _tie_a_cycle_to_each_task(loop: asyncio.AbstractEventLoop) -> list[tuple[weakref.ref, weakref.ref]]:
    """Every task the loop makes from now on holds a cycle (through a done callback,
    dropped when the task finishes): (the task, its cycle), by weak reference."""
    made: list[tuple[weakref.ref, weakref.ref]] = []

    def factory(loop, coro, **kwargs):
        task = asyncio.Task(coro, loop=loop, **kwargs)
        cycle = Cycle()
        task.add_done_callback(lambda _, cycle=cycle: None)
        made.append((weakref.ref(task), weakref.ref(cycle)))
        return task

    loop.set_task_factory(factory)
    return made


async def test_cancelled_rollouts_are_freed_after_the_freeze(make_api, frozen_heap):
    service, client = await make_api()  # no backend: every rollout waits in RUN until cancelled
    frozen_heap()
    loop = asyncio.get_running_loop()
    made = _tie_a_cycle_to_each_task(loop)
    try:
        gc.disable()  # only the explicit collection below: what it frees, refcounts did not
        r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 8}], "sampling": {"max_tokens": 8}})
        assert r.status_code == 202, r.text
        ids = r.json()["groups"][0]["rollout_ids"]

        async def all_waiting():
            return (await client.get("/v1/status")).json()["stages"]["run"]["busy"] == 8

        await eventually(all_waiting, what="8 rollouts waiting in RUN")
        for rid in ids:
            assert (await client.delete(f"/v1/rollouts/{rid}")).status_code in (200, 202)

        async def all_cancelled():
            views = [(await client.get(f"/v1/rollouts/{rid}")).json() for rid in ids]
            return all(v["done"] and v["result"]["status"] == "cancelled" for v in views)

        await eventually(all_cancelled, what="the 8 rollouts cancelled")
        await eventually(lambda: service.engine.pending == 0, what="nothing in flight")
        # The tasks that finished (the rollouts' among them) dropped their cycles; with
        # automatic collection off, the cycles are still there, then the collection frees them.
        done = [cycle for task, cycle in made if (t := task()) is None or t.done()]
        assert len(done) >= 8 and all(cycle() is not None for cycle in done)
        gc.collect()
        assert [cycle for cycle in done if cycle() is not None] == []
    finally:
        loop.set_task_factory(None)


def test_with_the_default_young_threshold_cycles_are_still_collected_automatically(frozen_heap):
    """No explicit collection: containers kept alive (as rollouts in flight keep theirs)
    count towards the young generation's threshold; its collection frees a cycle made
    after the freeze. (Python counts allocations less deallocations.)"""
    gc.enable()
    frozen_heap()
    gen0 = ServerConfig().gc_gen0
    set_young_threshold(gen0)
    assert gc.get_threshold()[0] == gen0
    dead = weakref.ref(_garbage_cycle())
    kept = []
    for i in range(3 * gen0):  # bounded: enough for the young generation's collection
        kept.append([i])
        if dead() is None:
            break
    assert dead() is None, f"a cycle survived {len(kept)} containers kept alive (counts {gc.get_count()})"
    assert len(kept) > gen0 // 2  # (it took the young collection, not an explicit one)


def _garbage_cycle() -> Cycle:
    cycle = Cycle()
    return cycle  # the caller keeps only a weak reference: unreachable but for itself


def test_a_young_threshold_that_would_stop_collection_is_refused():
    with pytest.raises(ValueError, match="gc_gen0"):
        set_young_threshold(0)
    with pytest.raises(pydantic.ValidationError, match="gc_gen0"):
        ServerConfig(gc_gen0=0)

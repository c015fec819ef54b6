"""``FifoSlots``: the FIFO limit of the stage pools and the backends' connection pools.
Waiters are served in order; a cancelled one never gets a slot, and leaves the queue
without a walk of it (popped once by a release, or compacted away)."""

import asyncio

import pytest

from rollserve.llm.slots import FifoSlots


async def _waiters(slots: FifoSlots, count: int, got: list[int]) -> list[asyncio.Task[None]]:
    async def wait(i: int) -> None:
        await slots.acquire()
        got.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(count)]
    for _ in range(3):  # each reaches its acquire
        await asyncio.sleep(0)
    return tasks


async def test_waiters_get_slots_in_the_order_they_came():
    slots = FifoSlots(1)
    await slots.acquire()
    got: list[int] = []
    tasks = await _waiters(slots, 5, got)
    for expected in range(5):
        slots.release()
        await tasks[expected]
        assert got == list(range(expected + 1))
    slots.release()
    await slots.acquire()  # the last release's slot was free


async def test_cancelled_waiters_never_get_a_slot_and_leave_the_queue():
    slots = FifoSlots(2)
    await slots.acquire()
    await slots.acquire()
    got: list[int] = []
    tasks = await _waiters(slots, 1000, got)
    for task in tasks[:-1]:  # all but the newest, cancelled at once (a stop)
        task.cancel()
    await asyncio.gather(*tasks[:-1], return_exceptions=True)
    assert slots.queued <= 1 + 32  # compacted as they left: no walk per cancel, no pile-up
    slots.release()  # to the one live waiter, past every cancelled one
    await tasks[-1]
    assert got == [999]
    slots.release()
    slots.release()
    assert slots.queued == 0
    await slots.acquire()
    await slots.acquire()  # both free again: no slot was lost to a cancelled waiter


async def test_a_waiter_given_a_slot_then_cancelled_passes_it_on():
    slots = FifoSlots(1)
    await slots.acquire()
    got: list[int] = []
    tasks = await _waiters(slots, 2, got)
    slots.release()  # to waiter 0, which is cancelled before it runs
    tasks[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    await tasks[1]
    assert got == [1]


async def test_a_closed_limit_gives_no_more_slots():
    slots = FifoSlots(1)
    await slots.acquire()
    got: list[int] = []
    tasks = await _waiters(slots, 3, got)
    slots.close()
    slots.release()  # kept, not handed to a waiter about to be cancelled
    late = asyncio.create_task(slots.acquire())  # nor to a newcomer
    for _ in range(3):
        await asyncio.sleep(0)
    assert got == [] and not late.done()
    for task in (*tasks, late):
        task.cancel()
    results = await asyncio.gather(*tasks, late, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError, match="limit"):
        FifoSlots(-1)

"""The start gate: a big batch's rollouts take their first steps over several passes
of the event loop, at most ``per_pass`` in each, in the order they came; one
cancelled while it waits takes no turn and ends cancelled."""

import asyncio

import pytest

from rollserve.contract import SubmitRequest
from rollserve.engine.pools import StartGate
from rollserve.engine.submit import submit
from tests.waiting import eventually


class PassCounter:
    """Counts passes of the event loop (a callback that schedules itself again)."""

    def __init__(self) -> None:
        self.passes = 0
        self._stopped = False
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.passes += 1
        if not self._stopped:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._stopped = True


async def test_at_most_per_pass_start_in_one_pass_in_order():
    gate = StartGate(per_pass=10)
    counter = PassCounter()
    woke: list[tuple[int, int]] = []  # (waiter, pass)

    async def waiter(i: int) -> None:
        await gate.turn()
        woke.append((i, counter.passes))

    await asyncio.gather(*(waiter(i) for i in range(95)))
    counter.stop()
    assert [i for i, _ in woke] == list(range(95))  # in the order they came
    per_pass: dict[int, int] = {}
    for _, p in woke:
        per_pass[p] = per_pass.get(p, 0) + 1
    assert max(per_pass.values()) == 10 and len(per_pass) == 10  # 9 passes of 10, one of 5
    assert gate.waiting == 0


async def test_a_cancelled_waiter_takes_no_turn():
    gate = StartGate(per_pass=2)
    waiters = [asyncio.ensure_future(gate.turn()) for _ in range(6)]
    await asyncio.sleep(0)  # all six queued
    waiters[0].cancel()
    waiters[1].cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [isinstance(r, asyncio.CancelledError) for r in results] == [True, True, False, False, False, False]
    assert gate.waiting == 0
    with pytest.raises(ValueError, match="per_pass"):
        StartGate(0)


class HeldGate(StartGate):
    """A start gate that lets no one through until ``open``: every rollout of a batch
    is surely waiting at it."""

    def __init__(self) -> None:
        super().__init__(per_pass=1)
        self.closed = True

    def _release(self) -> None:
        if self.closed:
            self._scheduled = False  # (the next turn schedules a release again)
            return
        super()._release()

    def open(self) -> None:
        self.closed = False
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._release)


async def test_a_rollout_cancelled_at_the_gate_ends_cancelled_in_queue(make_engine, handler):
    engine = await make_engine()
    gate = engine.starts = HeldGate()
    request = SubmitRequest.model_validate({"tasks": [{"data_source": "scripted", "instance": {}, "n": 50}]})
    ids = [rid for a in await submit(engine, request) for rid in a.rollout_ids]
    last = ids[-1]
    await eventually(lambda: gate.waiting == 50, timeout=60)  # all 50 begun, all at the gate
    assert last in engine._begun and handler.started["init"] == []
    assert engine.cancel(last) is True  # its task is cancelled while it waits for its turn
    gate.open()
    await engine.wait_finished(ids, 60)
    rows = {rid: await engine.store.rollout(rid) for rid in ids}
    assert rows[last].result.status == "cancelled" and rows[last].result.failure.stage == "queue"
    assert all(rows[rid].result.status == "completed" for rid in ids[:-1])
    assert last not in handler.started["init"] and len(handler.started["init"]) == 49  # it took no turn
    assert engine.status().live == {} and engine.starts.waiting == 0

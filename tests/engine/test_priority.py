"""The server's loop puts the API's work ahead of the rollouts': a request's next step
waits for one slice of rollout work at most, never for every rollout step queued before
it; the rollouts keep their own order, a cancelled callback does not run, an error in one
is reported and the rest run; the engine's rollouts are the background.

The slices are timed by a counter standing in for the clock (``priority._clock``): one
tick a look, so a slice is a known number of callbacks and nothing here depends on the
machine's speed."""

import asyncio
import contextvars

import pytest

from rollserve.commands.dataset_check import offline_context
from rollserve.engine import priority
from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.priority import ApiFirstLoop, background_context, in_background, loop_factory
from rollserve.engine.store import SQLiteStore
from tests.engine.conftest import NullRouter, OneHandlerRegistry, ScriptedHandler
from tests.engine.test_pipeline import _results, _submit

SLICE_S = 0.005
PER_SLICE = 5 * 8  # the clock is looked at every 8 callbacks; 5 looks of 1 ms fill a 5 ms slice


@pytest.fixture
def ticking_clock(monkeypatch):
    ticks = iter(range(10**9))
    monkeypatch.setattr(priority, "_clock", lambda: next(ticks) / 1000)


def _largest_wait(loop: asyncio.AbstractEventLoop, tasks: int = 500, steps: int = 20) -> int:
    """Rollout steps run between two steps of one request, at most, while ``tasks``
    rollouts take ``steps`` steps each."""
    done = 0

    async def rollout() -> None:
        nonlocal done
        for _ in range(steps):
            await asyncio.sleep(0)
            done += 1

    async def request() -> list[int]:
        seen = []
        for _ in range(10):
            seen.append(done)
            await asyncio.sleep(0)
        return [b - a for a, b in zip(seen, seen[1:], strict=False)]

    async def main() -> int:
        running = [asyncio.create_task(rollout(), context=background_context()) for _ in range(tasks)]
        await asyncio.sleep(0)  # every rollout has its steps queued
        waits = await request()
        await asyncio.gather(*running)
        return max(waits)

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_request_waits_for_one_slice_of_rollout_work_not_for_all_of_it(ticking_clock):
    assert _largest_wait(asyncio.new_event_loop()) >= 500  # asyncio's loop: every rollout's step first
    assert _largest_wait(ApiFirstLoop(SLICE_S)) <= PER_SLICE


def test_a_request_scheduled_behind_much_rollout_work_runs_after_one_slice_of_it(ticking_clock):
    loop = ApiFirstLoop(SLICE_S)
    ran: list[str] = []
    context = background_context()
    background = [f"background {i}" for i in range(100)]
    try:
        for name in background:
            loop.call_soon(ran.append, name, context=context)
        loop.call_soon(ran.append, "request")
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    # The first pass: a slice of the background, then the request; the rollouts' own order kept.
    assert ran == background[:PER_SLICE] + ["request"] + background[PER_SLICE:]


def test_a_cancelled_background_callback_does_not_run_and_an_error_is_reported():
    loop = ApiFirstLoop(SLICE_S)
    ran: list[int] = []
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, report: reported.append(report))
    context = background_context()

    def fails() -> None:
        raise ValueError("a rollout step's bug")

    try:
        cancelled = loop.call_soon(ran.append, 1, context=context)
        loop.call_soon(fails, context=context)
        loop.call_soon(ran.append, 2, context=context)
        cancelled.cancel()
        assert cancelled.cancelled() and loop.background_waiting == 3
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert ran == [2]
    assert [type(r["exception"]) for r in reported] == [ValueError]
    assert "fails" in reported[0]["message"]
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(ran.append, 3, context=context)


def test_the_mark_reaches_what_a_background_task_starts_and_nothing_else():
    async def main() -> tuple[bool, bool, bool]:
        async def child() -> bool:
            return in_background()

        async def rollout() -> tuple[bool, bool]:
            return in_background(), await asyncio.create_task(child())

        mine, childs = await asyncio.create_task(rollout(), context=background_context())
        return mine, childs, in_background()

    with asyncio.Runner(loop_factory=loop_factory(SLICE_S)) as runner:
        assert runner.run(main()) == (True, True, False)
    assert contextvars.copy_context().get(priority._BACKGROUND, False) is False


def test_a_slice_must_be_positive():
    with pytest.raises(ValueError, match="slice_s"):
        ApiFirstLoop(0)


def test_the_engines_rollouts_are_the_background_and_its_caller_is_not(tmp_path):
    handler = ScriptedHandler()
    seen: list[bool] = []
    init = handler.init

    async def noting_init(rollout):
        seen.append(in_background())
        await init(rollout)

    handler.init = noting_init

    async def main() -> list[float]:
        assert isinstance(asyncio.get_running_loop(), ApiFirstLoop)
        store = SQLiteStore(tmp_path / "store.db")
        await store.open()
        engine = Engine(
            store,
            OneHandlerRegistry(handler),
            NullRouter(),
            EngineConfig(),
            offline_context(runtime="local", state_dir=tmp_path),
        )
        await engine.start()
        try:
            ids = await _submit(engine, {"reward": 1.0}, {"reward": 0.5})
            return [r.reward for r in await _results(engine, ids)]
        finally:
            await engine.stop()
            await store.close()

    with asyncio.Runner(loop_factory=loop_factory(SLICE_S)) as runner:
        assert runner.run(main()) == [1.0, 0.5]
    assert seen == [True, True]

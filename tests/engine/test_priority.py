"""The server's loop puts the API's work ahead of the rollouts': a request's next step
waits for one slice of rollout work at most, never for every rollout step queued before
it; the rollouts keep their own order, a cancelled callback does not run, an error in one
is reported and the rest run; the engine's rollouts are the background.

Each runs on the server's loop (uvloop's) and on the fallback without uvloop (asyncio's
selector loop)."""

import asyncio
import contextvars

import pytest

from rollserve.commands.dataset_check import offline_context
from rollserve.engine import priority
from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.priority import (
    MIN_SLICE_S,
    ApiFirstLoop,
    ApiFirstMixin,
    background_context,
    enter_background,
    foreground_context,
    in_background,
    loop_factory,
)
from rollserve.engine.store import SQLiteStore
from tests.engine.conftest import NullRouter, OneHandlerRegistry, ScriptedHandler
from tests.engine.test_pipeline import _results, _submit

SLICE_S = 0.005
PER_SLICE = 5  # with the counter below: one tick a look at the clock, a look after each callback


class SelectorApiFirstLoop(ApiFirstMixin, asyncio.SelectorEventLoop):
    """The loop the server runs on where uvloop is not installed."""


LOOPS = [ApiFirstLoop, SelectorApiFirstLoop]


async def _drained(loop: ApiFirstMixin) -> None:
    """Until the background queue is empty (a pass at a time)."""
    while loop.background_waiting:
        await asyncio.sleep(0)


@pytest.fixture
def ticking_clock(monkeypatch):
    """The clock is a counter (a slice of 5 ticks: 5 callbacks), so nothing here
    depends on the machine's speed."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(priority, "_clock", lambda: next(ticks))


def _waits(loop: asyncio.AbstractEventLoop, tasks: int = 500, steps: int = 200) -> list[int]:
    """Rollout steps run between two steps of one request, step by step, while ``tasks``
    rollouts take ``steps`` steps each (the request starts once every rollout has
    taken its first)."""
    done = 0

    async def rollout() -> None:
        nonlocal done
        for _ in range(steps):
            await asyncio.sleep(0)
            done += 1

    async def main() -> list[int]:
        running = [asyncio.create_task(rollout(), context=background_context()) for _ in range(tasks)]
        while done < tasks:  # until the rollouts are well under way
            await asyncio.sleep(0)
        seen = []
        for _ in range(40):
            seen.append(done)
            await asyncio.sleep(0)
        await asyncio.gather(*running)
        return [b - a for a, b in zip(seen, seen[1:], strict=False)]

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("make", LOOPS)
def test_a_request_waits_for_one_slice_of_rollout_work_not_for_all_of_it(ticking_clock, make):
    assert min(_waits(asyncio.new_event_loop())) >= 500  # asyncio's loop: every rollout's step first
    waits = _waits(make(PER_SLICE))
    assert 0 < min(waits) and max(waits) <= PER_SLICE  # the rollouts go on, a slice a pass


@pytest.mark.parametrize("make", LOOPS)
def test_a_request_scheduled_behind_much_rollout_work_runs_after_one_slice_of_it(ticking_clock, make):
    loop = make(PER_SLICE)
    ran: list[str] = []
    context = background_context()
    background = [f"background {i}" for i in range(100)]
    try:
        for name in background:
            loop.call_soon(ran.append, name, context=context)
        loop.call_soon(ran.append, "request")
        loop.run_until_complete(_drained(loop))
    finally:
        loop.close()
    # The first pass: a slice of the background, then the request; the rollouts' own order kept.
    assert ran == background[:PER_SLICE] + ["request"] + background[PER_SLICE:]


@pytest.mark.parametrize("make", LOOPS)
def test_a_closed_loop_drops_what_waited_and_refuses_more(make):
    loop = make(SLICE_S)
    context = background_context()
    kept = object()
    loop.call_soon(lambda held: None, kept, context=context)
    assert loop.background_waiting == 1
    loop.close()
    assert loop.background_waiting == 0
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(print, context=context)


@pytest.mark.parametrize("make", LOOPS)
def test_in_debug_mode_the_loop_does_not_slice(make):
    loop = make(SLICE_S)
    ran: list[str] = []
    try:
        loop.set_debug(True)
        loop.call_soon(ran.append, "background", context=background_context())
        loop.call_soon(ran.append, "request")
        assert loop.background_waiting == 0  # asyncio's own queue, with its checks
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert ran == ["background", "request"]


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
        loop.run_until_complete(_drained(loop))
    finally:
        loop.close()
    assert ran == [2]
    assert [type(r["exception"]) for r in reported] == [ValueError]
    assert "fails" in reported[0]["message"]
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(ran.append, 3, context=context)


def test_the_mark_reaches_what_a_background_task_starts_and_nothing_else():
    async def main() -> tuple[bool, ...]:
        async def mark() -> bool:
            return in_background()

        async def rollout() -> tuple[bool, bool, bool]:
            shared = asyncio.create_task(mark(), context=foreground_context())  # e.g. the store's writer
            return in_background(), await asyncio.create_task(mark()), await shared

        async def gateway_call() -> tuple[bool, bool]:
            enter_background()
            return in_background(), await asyncio.create_task(mark())

        mine, childs, shared = await asyncio.create_task(rollout(), context=background_context())
        call, call_child = await asyncio.create_task(gateway_call())
        return mine, childs, shared, call, call_child, in_background()

    with asyncio.Runner(loop_factory=loop_factory(SLICE_S)) as runner:
        assert runner.run(main()) == (True, True, False, True, True, False)
    assert contextvars.copy_context().get(priority._BACKGROUND, False) is False


def test_a_slice_must_be_long_enough_to_be_one():
    for bad in (0, -1, MIN_SLICE_S / 10):
        with pytest.raises(ValueError, match="slice_s"):
            ApiFirstLoop(bad)


def test_the_engines_rollouts_are_the_background_and_its_caller_is_not(tmp_path, monkeypatch):
    handler = ScriptedHandler()
    seen: list[bool] = []
    init = handler.init
    writers: dict[str, bool] = {}  # the store's shared writers, started by a rollout: not background
    for name in ("_write_finished", "_flush_soon"):
        original = getattr(SQLiteStore, name)

        async def noting(self, _name=name, _original=original):
            writers[_name] = in_background()
            await _original(self)

        monkeypatch.setattr(SQLiteStore, name, noting)

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
    assert writers == {"_write_finished": False, "_flush_soon": False}

"""Router control: health checks drain a failing backend, drain/undrain/remove, and
pause/resume around a weight update (finish or abort what is in flight)."""

import asyncio
import time

import pytest

from rollserve.errors import LLMError
from rollserve.llm.backends.sglang import SGLangBackend
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import ChatReply, Generation, LLMBackend, SamplingParams
from rollserve.llm.routing.health import HealthConfig
from rollserve.llm.routing.router import Router, RouterConfig
from rollserve.testing.fake_sglang import FakeSGLang
from rollserve.testing.fake_vllm import FakeVLLM
from tests.waiting import eventually

SAMPLING = SamplingParams(max_tokens=4)
FAST_HEALTH = RouterConfig(health=HealthConfig(interval=0.05, backoff_base=0.02, backoff_max=0.1), retry_backoff=0.01)
# asyncio runs a timer up to its clock's resolution early: the one slack a lower bound on
# the time between probes needs.
CLOCK = time.get_clock_info("monotonic").resolution


def backoff(failures: int) -> float:
    """The least wait after ``failures`` failed probes in a row (health.py's backoff)."""
    config = FAST_HEALTH.health
    return min(config.backoff_max, config.backoff_base * 2 ** (failures - 1))


class Backend(LLMBackend):
    """A stub server: ``up`` decides health and calls; ``gate`` holds calls."""

    trainable = True

    def __init__(self, name, gate=None):
        self.name = name
        self.gate = gate
        self.up = True
        self.calls = 0
        self.probes = 0
        self.probed_at: list[float] = []  # the loop's clock at each health probe
        self.failed_at: list[float] = []  # ... at each probe that found it down
        self.closed = False

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        if not self.up:
            raise LLMError(f"{self.name}: connection refused", backend=self.name)
        if self.gate is not None:
            await self.gate.wait()
        return Generation([5, 2], [-1.0, -0.5], "stop")

    async def health(self):
        self.probes += 1
        self.probed_at.append(asyncio.get_running_loop().time())
        if not self.up:
            self.failed_at.append(self.probed_at[-1])
        return self.up

    async def close(self):
        self.closed = True

    def describe(self):
        return {"name": self.name, "kind": "stub", "trainable": True}


# --- health ------------------------------------------------------------------------
async def test_a_failing_backend_is_drained_and_comes_back():
    router = Router(config=FAST_HEALTH)
    a, b = Backend("a"), Backend("b")
    router.add(a)
    router.add(b)
    await router.start()
    try:
        session = router.session("t")
        await session.generate([1], SAMPLING)
        pinned, other = (a, b) if session.backend == "a" else (b, a)
        pinned.up = False
        # The call fails over at once; the failed backend is probed and marked unhealthy.
        gen = await session.generate([1], SAMPLING)
        assert gen.backend == other.name and session.backend == other.name
        await eventually(lambda: not router.is_healthy(pinned.name))
        for i in range(4):  # no new trajectory goes there while it is down
            assert (await router.session(f"n{i}").generate([1], SAMPLING)).backend == other.name
        # Backing off: after its k-th failed probe in a row, the next comes no sooner than
        # min(backoff_max, backoff_base * 2^(k-1)): 20, 40, 80, then 100 ms. (The first or
        # second failed probe may be the one the failed call asked for at once.)
        await eventually(lambda: len(pinned.failed_at) >= 5, what="five failed probes")
        times = pinned.failed_at
        for k in range(2, 5):
            assert times[k] - times[k - 1] >= backoff(k) - CLOCK, (k, times)
        pinned.up = True
        await eventually(lambda: router.is_healthy(pinned.name))
        assert {s["name"]: s["healthy"] for s in router.list()} == {"a": True, "b": True}
    finally:
        await router.stop()
    assert a.closed and b.closed and not router.list()


async def test_health_checks_run_on_a_schedule():
    router = Router(config=FAST_HEALTH)
    a = Backend("a")
    router.add(a)
    await router.start()
    await eventually(lambda: a.probes >= 4, what="four health probes")
    await router.stop()
    assert not router.health.running
    # At start, then (while healthy) no sooner than every ``interval``.
    gaps = [later - earlier for earlier, later in zip(a.probed_at, a.probed_at[1:])]
    assert all(gap >= FAST_HEALTH.health.interval - CLOCK for gap in gaps), gaps


# --- drain, undrain, remove ------------------------------------------------------------
async def test_drain_finishes_in_flight_and_takes_nothing_new():
    router = Router()
    gate = asyncio.Event()
    a, b = Backend("a", gate), Backend("b")
    router.add(a)
    session = router.session("t")
    in_flight = asyncio.create_task(session.generate([1], SAMPLING))
    await asyncio.sleep(0)
    router.add(b)
    state = router.drain("a")
    assert state["draining"] is True and state["outstanding"] == 1
    assert not await router.wait_drained("a", timeout=0.05)
    gen = await session.generate([1], SAMPLING)  # the trajectory moves at its next call
    assert gen.backend == "b"
    gate.set()
    assert (await in_flight).backend == "a"  # what was in flight finished where it was
    assert await router.wait_drained("a", timeout=1)
    assert a.calls == 1
    router.undrain("a")
    router.drain("b")
    assert (await router.session("new").generate([1], SAMPLING)).backend == "a"


async def test_remove_gives_in_flight_calls_a_grace_period():
    router = Router()
    gate = asyncio.Event()
    a, b = Backend("a", gate), Backend("b")
    router.add(a)
    call = asyncio.create_task(router.session().generate([1], SAMPLING))
    await asyncio.sleep(0)
    router.add(b)
    removing = asyncio.create_task(router.remove("a", grace=5))
    await eventually(lambda: [s["name"] for s in router.list()] == ["b"])
    assert not removing.done() and not a.closed  # waiting for the call the gate holds
    gate.set()
    await asyncio.wait_for(removing, 1)
    assert a.closed and (await call).backend == "a"


# --- pause and resume -----------------------------------------------------------------
async def test_pause_finish_lets_in_flight_complete_and_holds_new_calls():
    router = Router(policy_version=1)
    gate = asyncio.Event()
    router.add(Backend("a", gate))
    before = asyncio.create_task(router.session("old").generate([1], SAMPLING))
    await asyncio.sleep(0)
    pausing = asyncio.create_task(router.pause("finish"))
    await eventually(lambda: router.paused)
    assert not pausing.done()  # waits for the call in flight (the gate holds it)
    after = asyncio.create_task(router.session("new").generate([1], SAMPLING))
    gate.set()
    report = await asyncio.wait_for(pausing, 1)
    assert report == {
        "paused": True,
        "mode": "finish",
        "aborted": 0,
        "drained": True,
        "in_flight": 0,
        "policy_version": 1,
        "forwarded": {},
    }
    assert (await before).policy_version == 1
    # Held while paused: it has not run (it would have version 1), and when it does after
    # the resume, it runs at the new version.
    assert not after.done()
    await router.resume(policy_version=2)
    assert (await asyncio.wait_for(after, 1)).policy_version == 2
    assert router.status()["paused"] is False


async def test_pause_abort_sends_in_flight_calls_again_after_resume():
    router = Router(policy_version=1)
    gate = asyncio.Event()
    a = Backend("a", gate)
    router.add(a)
    calls = [asyncio.create_task(router.session(str(i)).generate([1], SAMPLING)) for i in range(3)]
    await asyncio.sleep(0)
    report = await asyncio.wait_for(router.pause("abort"), 1)
    assert report["aborted"] == 3 and report["drained"] and router.in_flight == 0
    assert a.calls == 3 and not any(c.done() for c in calls)
    gate.set()
    await router.resume(policy_version=7)
    gens = await asyncio.wait_for(asyncio.gather(*calls), 1)
    assert [g.policy_version for g in gens] == [7, 7, 7] and a.calls == 6
    assert router.counters["aborted_by_pause"] == 3 and router.counters["failed"] == 0


async def test_a_paused_call_still_ends_at_its_deadline():
    router = Router()
    router.add(Backend("a"))
    await router.pause("finish")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await router.session().generate([1], SAMPLING)


@pytest.mark.parametrize("mode", ["finish", "abort"])
async def test_pause_is_forwarded_to_servers_that_support_it(tok, chat_prompt, mode):
    async with FakeVLLM(tok, dev_mode=True) as vllm, FakeSGLang(tok) as sglang:
        router = Router(policy_version=1, config=RouterConfig(forward_pause=True))
        router.add(VLLMBackend(vllm.url, name="v"))
        router.add(SGLangBackend(sglang.url, name="s"))
        report = await router.pause(mode)
        assert report["forwarded"] == {"v": "ok", "s": "ok"}
        assert vllm.paused and sglang.paused
        resumed = await router.resume(2)
        assert resumed["forwarded"] == {"v": "ok", "s": "ok"} and resumed["policy_version"] == 2
        assert not vllm.paused and not sglang.paused
        gen = await router.session().generate(chat_prompt(), SAMPLING)
        assert gen.policy_version == 2
        await router.stop()
    assert vllm.pauses == ["wait" if mode == "finish" else "abort"]


# --- message-level backends ---------------------------------------------------------------
async def test_message_level_sessions_use_chat_backends_only():
    class Chat(Backend):
        trainable = False

        async def chat(self, messages, sampling, tools=None):
            self.calls += 1
            return ChatReply(content="hi", finish_reason="stop")

    router = Router(policy_version=3)
    chat = Chat("api")
    router.add(chat)
    session = router.session()
    assert await session.message_level()
    reply = await session.chat([{"role": "user", "content": "x"}], SAMPLING)
    assert reply.content == "hi" and reply.backend == "api" and reply.policy_version == 3
    router.add(Backend("tokens"))
    fresh = router.session()
    assert not await fresh.message_level()  # token backends first when there are any
    assert (await fresh.generate([1], SAMPLING)).backend == "tokens"


async def test_a_hung_try_is_abandoned_and_retried_elsewhere(tok, chat_prompt):
    async with FakeVLLM(tok, replies="hung") as hung, FakeVLLM(tok, replies="fine") as fine:
        router = Router(config=RouterConfig(attempt_timeout=0.2, retry_backoff=0.01))
        router.add(VLLMBackend(hung.url, name="hung", model="m"))
        session = router.session()
        await session.generate(chat_prompt(), SAMPLING)
        router.add(VLLMBackend(fine.url, name="fine", model="m"))
        hung.fail_next(1, mode="hang")
        gen = await asyncio.wait_for(session.generate(chat_prompt(), SAMPLING), 2)
        assert gen.backend == "fine" and gen.output_ids == fine.calls[-1].output_ids
        assert router.counters["retries"] == 1
        await router.stop()

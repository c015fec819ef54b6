"""Router: least-outstanding pick, sticky sessions, waiting for a backend, one retry."""

import asyncio

import pytest

from rollserve.errors import LLMError
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import Generation, LLMBackend, SamplingParams
from rollserve.llm.routing.deadline import call_deadline
from rollserve.llm.routing.router import Router, RouterConfig
from rollserve.testing import FakeVLLM
from tests.waiting import settle

SAMPLING = SamplingParams(max_tokens=4)


class StubBackend(LLMBackend):
    """Answers after ``gate`` opens (if given); fails while ``failures`` > 0."""

    trainable = True

    def __init__(self, name: str, gate: asyncio.Event | None = None, failures: int = 0):
        self.name = name
        self.gate = gate
        self.failures = failures
        self.calls = 0
        self.closed = False

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise LLMError(f"{self.name} is down")
        return Generation([7, 2], [-0.5, -0.1], "stop")

    async def health(self):
        return True

    async def close(self):
        self.closed = True

    def describe(self):
        return {"name": self.name, "kind": "stub", "trainable": True}


async def test_new_sessions_go_to_the_backend_with_fewest_outstanding():
    router = Router()
    gate = asyncio.Event()
    a, b = StubBackend("a", gate), StubBackend("b", gate)
    router.add(a)
    router.add(b)
    busy = [asyncio.create_task(router.session(f"s{i}").generate([1], SAMPLING)) for i in range(3)]
    await asyncio.sleep(0)
    # Three calls spread as they arrive: a, b, then a (tie on outstanding -> fewer sessions).
    assert (router.outstanding("a"), router.outstanding("b")) == (2, 1)
    late = router.session("late")
    task = asyncio.create_task(late.generate([1], SAMPLING))
    await asyncio.sleep(0)
    assert late.backend == "b"
    gate.set()
    await asyncio.gather(*busy, task)
    assert router.outstanding("a") == router.outstanding("b") == 0
    assert {d["name"]: d["outstanding"] for d in router.list()} == {"a": 0, "b": 0}


async def test_sessions_are_sticky():
    router = Router()
    router.add(StubBackend("a"))
    router.add(StubBackend("b"))
    session = router.session("traj")
    first = await session.generate([1], SAMPLING)
    pinned = session.backend
    for _ in range(5):
        gen = await session.generate([1, 7, 2, 3], SAMPLING)
        assert gen.backend == pinned == first.backend
    assert router.get(pinned).calls == 6


async def test_a_removed_backend_is_replaced_at_the_next_call():
    router = Router()
    a = StubBackend("a")
    router.add(a)
    session = router.session()
    await session.generate([1], SAMPLING)
    router.add(StubBackend("b"))
    await router.remove("a")
    assert a.closed
    gen = await session.generate([1], SAMPLING)
    assert gen.backend == "b" and session.backend == "b"
    with pytest.raises(KeyError):
        await router.remove("a")


async def test_unhealthy_backends_get_no_sessions():
    router = Router()
    router.add(StubBackend("a"))
    router.add(StubBackend("b"))
    router.set_healthy("a", False)
    for i in range(3):
        assert (await router.session(str(i)).generate([1], SAMPLING)).backend == "b"


async def test_waits_for_a_backend_added_later():
    router = Router()
    session = router.session()
    task = asyncio.create_task(session.generate([1], SAMPLING))
    await settle()  # (no I/O: a call that failed for want of a backend would be done)
    assert not task.done()  # waiting on an event, not failing
    router.add(StubBackend("late"))
    gen = await asyncio.wait_for(task, 1)
    assert gen.backend == "late"


async def test_the_callers_deadline_bounds_the_wait():
    router = Router()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await router.session().generate([1], SAMPLING)


async def test_llm_error_is_retried_on_another_backend():
    router = Router()
    broken = StubBackend("broken", failures=10)
    router.add(broken)
    session = router.session()
    with pytest.raises(LLMError):  # nowhere else to go
        await session.generate([1], SAMPLING)
    router.add(StubBackend("ok"))
    gen = await session.generate([1], SAMPLING)
    assert gen.backend == "ok" and session.backend == "ok"
    assert router.outstanding("broken") == router.outstanding("ok") == 0


async def test_policy_version_and_duplicate_names():
    router = Router(policy_version=3)
    session = router.session()
    assert session.policy_version == 3
    router.policy_version = 4
    assert session.policy_version == 4
    router.add(StubBackend("a"))
    with pytest.raises(ValueError, match="already registered"):
        router.add(StubBackend("a"))


async def test_retry_across_real_servers(tok, chat_prompt):
    async with FakeVLLM(tok, replies="from one") as one, FakeVLLM(tok, replies="from two") as two:
        router = Router()
        router.add(VLLMBackend(one.url, name="one", model="m"))
        router.add(VLLMBackend(two.url, name="two", model="m"))
        session = router.session()
        gen = await session.generate(chat_prompt(), SAMPLING)
        failing = one if session.backend == "one" else two
        failing.fail_next(1)
        gen = await session.generate(chat_prompt(), SAMPLING)
        other = two if failing is one else one
        assert gen.output_ids == other.calls[-1].output_ids
        await router.remove("one")
        await router.remove("two")


# --- the least-load policy, retries and deadlines -------------------------------------------
class TimedBackend(StubBackend):
    """Answers after ``latency`` seconds, ``capacity`` at a time (a server's batch)."""

    def __init__(self, name, latency, capacity=1):
        super().__init__(name)
        self.latency = latency
        self.slots = asyncio.Semaphore(capacity)

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        async with self.slots:
            await asyncio.sleep(self.latency)
        return Generation([7, 2], [-0.5, -0.1], "stop")


async def test_least_load_learns_which_backend_is_slow():
    router = Router()
    fast, slow = TimedBackend("fast", 0.01), TimedBackend("slow", 0.04)
    router.add(fast)
    router.add(slow)
    # Everyone is equal before any measurement: the first wave splits evenly.
    await asyncio.gather(*[router.session(f"w{i}").generate([1], SAMPLING) for i in range(8)])
    assert fast.calls == slow.calls == 4
    states = {s.name: s for s in router.states()}
    assert states["slow"].unit_cost > 2 * states["fast"].unit_cost
    # With speeds known, a burst of new trajectories fills the slow one to a quarter depth.
    await asyncio.gather(*[router.session(f"b{i}").generate([1], SAMPLING) for i in range(20)])
    assert fast.calls - 4 >= 2.5 * (slow.calls - 4)


async def test_a_pinned_trajectory_leaves_a_backend_with_a_queue():
    router = Router()
    gate = asyncio.Event()
    a, b = StubBackend("a", gate), StubBackend("b")
    router.add(a)
    session = router.session("t")
    first = asyncio.create_task(session.generate([1], SAMPLING))
    await asyncio.sleep(0)
    assert session.backend == "a"
    blockers = [asyncio.create_task(router.session(f"q{i}").generate([1], SAMPLING)) for i in range(6)]
    await asyncio.sleep(0)
    router.add(b)  # idle, while "a" has 7 requests queued
    gen = await asyncio.wait_for(session.generate([1], SAMPLING), 1)
    assert gen.backend == "b" and session.backend == "b" and router.counters["moves"] == 1
    gate.set()
    await asyncio.gather(first, *blockers)
    # Balanced again: it stays where its prefix is cached.
    assert (await session.generate([1], SAMPLING)).backend == "b"


async def test_retries_back_off_and_count_attempts():
    router = Router(config=RouterConfig(max_attempts=3, retry_backoff=0.02))
    flaky = StubBackend("flaky", failures=2)
    router.add(flaky)
    started = asyncio.get_running_loop().time()
    gen = await router.session().generate([1], SAMPLING)
    assert gen.backend == "flaky" and flaky.calls == 3
    assert asyncio.get_running_loop().time() - started >= 0.02 + 0.04
    flaky.failures = 5
    with pytest.raises(LLMError, match="gave up after 3 tries") as info:
        await router.session().generate([1], SAMPLING)
    assert info.value.attempts == 3 and info.value.backend == "flaky"
    assert router.counters["retries"] == 4 and router.counters["failed"] == 1


async def test_a_bad_request_is_not_retried():
    router = Router()

    class Rejecting(StubBackend):
        async def generate(self, prompt_ids, sampling):
            self.calls += 1
            raise LLMError("HTTP 400: too long", status=400, backend=self.name, retryable=False)

    bad, good = Rejecting("bad"), StubBackend("good")
    router.add(bad)
    session = router.session()
    with pytest.raises(LLMError, match="400") as info:
        await session.generate([1], SAMPLING)
    router.add(good)
    assert bad.calls == 1 and info.value.attempts == 1 and good.calls == 0


async def test_retries_stop_at_the_calls_deadline():
    # The most attempts allowed, 0.05 s apart (5 s in all): fewer means the call's 0.3 s
    # deadline ended it (the 60 s bound fails the test if nothing does).
    many = 100
    router = Router(config=RouterConfig(max_attempts=many, retry_backoff=0.05, retry_backoff_max=0.05))
    router.add(StubBackend("down", failures=10 * many))
    with call_deadline(asyncio.get_running_loop().time() + 0.3):
        with pytest.raises(LLMError) as info:
            await asyncio.wait_for(router.session().generate([1], SAMPLING), 60)
    assert 1 <= info.value.attempts < many


async def test_each_generation_carries_the_version_it_was_sent_under():
    router = Router(policy_version=1)
    gate = asyncio.Event()
    router.add(StubBackend("a", gate))
    task = asyncio.create_task(router.session().generate([1], SAMPLING))
    await asyncio.sleep(0)
    router.policy_version = 2  # (a resume without a pause: the request already left)
    gate.set()
    assert (await task).policy_version == 1
    assert (await router.session().generate([1], SAMPLING)).policy_version == 2

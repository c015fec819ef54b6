"""Router: least-outstanding pick, sticky sessions, waiting for a backend, one retry."""

import asyncio

import pytest

from rollserve.errors import LLMError
from rollserve.llm.base import Generation, SamplingParams
from rollserve.llm.router import Router
from rollserve.llm.vllm import VLLMBackend
from rollserve.testing import FakeVLLM

SAMPLING = SamplingParams(max_tokens=4)


class StubBackend:
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
    await asyncio.sleep(0.05)
    assert not task.done()  # waiting on an event, not failing
    router.add(StubBackend("late"))
    gen = await asyncio.wait_for(task, 1)
    assert gen.backend == "late"


async def test_the_callers_deadline_bounds_the_wait():
    router = Router()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await router.session().generate([1], SAMPLING)


async def test_llm_error_is_retried_once_on_another_backend():
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

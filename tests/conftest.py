"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.engine.pipeline import EngineConfig
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM


@pytest.fixture(scope="session")
def tok() -> ChatTokenizer:
    """The real SmolLM2 ChatML tokenizer (read from the GGUF once, then cached)."""
    return ChatTokenizer.load("smollm2")


@pytest.fixture
def chat_prompt(tok):
    def make(text: str = "What is 2+2?") -> list[int]:
        rendered = tok.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return tok.encode(rendered)

    return make


@pytest.fixture
async def loop_gaps():
    """Seconds between ticks of a 10 ms heartbeat on the event loop while the test
    runs: a blocked loop shows up as a long gap."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(tick())
    yield gaps
    task.cancel()


@pytest.fixture
async def fake_llm():
    async with FakeVLLM("smollm2", replies=["Adding them: \\boxed{4}"], latency=0.01) as server:
        yield server


@pytest.fixture
async def make_api(tmp_path):
    """Build a service + in-process HTTP client; pass backends=[url] or none,
    ``prorl=ProRLConfig(...)`` to serve ProRL Agent's routes too, ``server={...}`` for
    other ServerConfig settings, and EngineConfig's as keywords."""
    made = []

    async def make(backends=(), token=None, prorl=None, server=None, **engine):
        config = ServerConfig(state_dir=tmp_path / f"state{len(made)}", api_token=token,
                              backends=list(backends), engine=EngineConfig(**engine),
                              **(server or {}))
        service = Service(config)
        await service.start()
        app = create_app(service, manage_lifecycle=False, prorl=prorl)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                   base_url="http://rollserve", timeout=30)
        made.append((service, client))
        return service, client

    yield make
    for service, client in made:
        await client.aclose()
        await service.stop()


_IPYTHON_PROBE: dict[str, str | None] = {}  # probed once per test session


@pytest.fixture
async def ipython_in_bubblewrap(tmp_path):
    """Skip (saying why) where no python with IPython can run inside a bubblewrap
    sandbox: e.g. a root server whose interpreter and packages live under /root, which
    sandboxes (running as a uid of their own) cannot reach."""
    from rollserve.handlers.sandboxed import find_python
    from rollserve.sandbox.base import SandboxError, SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime

    reason = BubblewrapRuntime.unavailable_reason()
    if reason is None and "bubblewrap" not in _IPYTHON_PROBE:
        async with await BubblewrapRuntime(state_dir=tmp_path).start(SandboxSpec()) as box:
            try:
                await find_python(box)
                _IPYTHON_PROBE["bubblewrap"] = None
            except SandboxError as error:
                _IPYTHON_PROBE["bubblewrap"] = str(error)
    reason = reason or _IPYTHON_PROBE.get("bubblewrap")
    if reason:
        pytest.skip(f"the python tool cannot run here: {reason}")

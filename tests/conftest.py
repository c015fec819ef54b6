"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollserve.llm.tokenizer import ChatTokenizer


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

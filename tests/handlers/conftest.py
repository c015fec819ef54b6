"""Shared fixtures for handler tests: the real SmolLM2 tokenizer, a scoring pool,
a scripted LLM session and a rollout factory."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from rollserve.engine.rollout import Rollout, RolloutSpec
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.scoring import ScoringPool
from rollserve.llm.base import Generation, SamplingParams
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from tests.llm_doubles import TokenLevelSession

_ids = itertools.count()


@pytest.fixture(scope="session")
def tokenizer(tok) -> ChatTokenizer:
    return tok


@pytest.fixture
async def scoring():
    pool = ScoringPool(workers=2, default_timeout=10.0)
    await pool.astart()
    yield pool
    await pool.aclose()


@pytest.fixture
def ctx(tokenizer, scoring) -> HandlerContext:
    return HandlerContext(tokenizer=tokenizer, scoring=scoring)


class ScriptedLLM(TokenLevelSession):
    """An LLMSession that replies with canned texts, tokenized by the real tokenizer.

    Each reply is its tokens plus EOS ("stop"), cut to ``max_tokens`` ("length").
    ``block_after`` makes call number N (0-based) wait forever, to test cancellation.
    """

    def __init__(self, tokenizer: ChatTokenizer, replies: list[str], block_after: int | None = None):
        self.tok = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.block_after = block_after
        self.blocked = False  # a call is waiting forever (``block_after``)

    @property
    def policy_version(self) -> int | None:
        return 7

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if self.block_after is not None and len(self.prompts) >= self.block_after:
            self.blocked = True
            await asyncio.Event().wait()
        self.prompts.append(list(prompt_ids))
        await asyncio.sleep(0)
        ids = self.tok.encode(self.replies.pop(0)) + [self.tok.eos_token_id]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        return Generation(ids, [-0.25] * len(ids), finish, backend="scripted")


@pytest.fixture
def scripted(tokenizer):
    def make(replies: list[str], **kwargs) -> ScriptedLLM:
        return ScriptedLLM(tokenizer, replies, **kwargs)

    return make


def _make_rollout(instance: dict, max_turns: int = 3, max_context_tokens: int = 2048, llm=None) -> Rollout:
    n = next(_ids)
    spec = RolloutSpec(
        id=f"r{n}",
        group_id="g",
        task_id=f"t{n}",
        data_source="math",
        sample_index=0,
        instance=instance,
        sampling=SamplingParams(max_tokens=128, temperature=0.0),
    )
    rollout = Rollout(spec=spec, max_turns=max_turns, max_context_tokens=max_context_tokens)
    rollout.llm = llm
    return rollout


@pytest.fixture
def new_rollout():
    """Factory: ``new_rollout(instance, max_turns=3, max_context_tokens=2048, llm=None)``."""
    return _make_rollout

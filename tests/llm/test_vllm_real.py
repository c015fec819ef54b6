"""VLLMBackend against a real vLLM server serving SmolLM2-135M-Instruct.

Skipped unless ROLLSERVE_VLLM_URL points at one (shared/REAL_VLLM.md says how to
run vLLM 0.32 on a CPU machine): ROLLSERVE_VLLM_URL=http://127.0.0.1:8000 pytest -m vllm
"""

import asyncio

import aiohttp
import pytest

from rollserve.agent.base import AgentEnv, Step
from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.trajectory import Trajectory
from rollserve.errors import ContextWindowError
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router, RouterConfig
from tests.waiting import eventually

pytestmark = pytest.mark.vllm  # each test takes `vllm_url` (tests/real_vllm.py): skips without one


async def test_greedy_ids_and_logprobs(vllm_url, chat_prompt, tok):
    backend = VLLMBackend(vllm_url)
    assert await backend.health()
    prompt = chat_prompt("What is the capital of France?")
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    first = await backend.generate(prompt, greedy)  # the server checks prompt_token_ids
    second = await backend.generate(prompt, greedy)
    await backend.close()
    assert first.output_ids == second.output_ids
    assert len(first.output_ids) == len(first.logprobs) > 0
    assert all(lp <= 0 for lp in first.logprobs)
    assert backend.model  # discovered from /v1/models
    if first.finish_reason == "stop":
        assert first.output_ids[-1] == tok.eos_token_id  # the eos is returned, with its logprob


async def test_length_finish_and_seeded_sampling(vllm_url, chat_prompt, tok):
    backend = VLLMBackend(vllm_url)
    prompt = chat_prompt("Write a long poem about the sea.")
    cut = await backend.generate(prompt, SamplingParams(temperature=0.0, max_tokens=5))
    assert cut.finish_reason == "length" and len(cut.output_ids) == 5
    seeded = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234, max_tokens=16)
    a = await backend.generate(prompt, seeded)
    b = await backend.generate(prompt, seeded)
    await backend.close()
    assert a.output_ids == b.output_ids


async def test_server_tokenizer_agrees_with_ours(vllm_url, tok):
    messages = [
        {"role": "user", "content": "ls -la:\ntotal 0\ndrwxr-xr-x  2 root root  40 Jan  1 00:00 ."},
        {"role": "assistant", "content": "Listed 123 files."},
        {"role": "user", "content": "Now compute 4567 * 89."},
    ]
    async with aiohttp.ClientSession() as client:
        async with client.post(
            vllm_url + "/tokenize", json={"messages": messages, "add_generation_prompt": True}
        ) as resp:
            served = (await resp.json())["tokens"]
    assert served == tok.encode(tok.render(messages, add_generation_prompt=True))


class TwoTurnEnv(AgentEnv):
    tools = None

    def __init__(self):
        self.turns = 0

    def initial_messages(self):
        return [{"role": "user", "content": "Name a color."}]

    async def step(self, reply):
        self.turns += 1
        if self.turns == 2:
            return Step(done=True)
        return Step(messages=[{"role": "user", "content": "Another one?"}])


async def test_two_turn_episode_is_append_only(vllm_url, tok):
    router = Router(policy_version=0)
    router.add(VLLMBackend(vllm_url, name="real"))
    trajectory = Trajectory()
    await run_agent_loop(
        TwoTurnEnv(),
        router.session(),
        tok,
        SamplingParams(temperature=0.0, max_tokens=24),
        max_turns=2,
        max_context_tokens=2048,
        trajectory=trajectory,
        stats=LoopStats(),
    )
    await router.remove("real")
    assert len(trajectory.turns) == 2 and trajectory.fidelity.append_only
    position = 0
    for turn in trajectory.turns:
        position += len(turn.prompt_ids_delta)
        end = position + len(turn.output_ids)
        assert trajectory.input_ids[position:end] == turn.output_ids
        assert trajectory.logprobs[position:end] == turn.logprobs
        position = end


async def test_the_context_window_is_read_and_its_refusals_are_typed(vllm_url):
    backend = VLLMBackend(vllm_url)
    assert await backend.health()
    window = backend.context_window()  # max_model_len from /v1/models
    assert window is not None and window > 8
    greedy = SamplingParams(temperature=0.0, max_tokens=50)
    cut = await backend.generate([1] * (window - 3), greedy)  # max_tokens cut to the room left
    assert cut.finish_reason == "length" and len(cut.output_ids) == 3
    with pytest.raises(ContextWindowError, match="not sent"):
        await backend.generate([1] * window, greedy)
    await backend.close()
    blind = VLLMBackend(vllm_url)  # one that never read the window: the server's own refusals
    blind.window_path = None
    for length in (window, window + 1, window + 5):
        with pytest.raises(ContextWindowError) as info:
            await blind.generate([1] * length, greedy)
        assert info.value.status == 400 and not info.value.retryable
    await blind.close()


# Run the server with --enable-scale-out and VLLM_SERVER_DEV_MODE=1 for the two below;
# on a plain server the first checks the fallback and the second skips.
async def test_tokens_only_generate_agrees_with_completions(vllm_url, chat_prompt):
    prompt = chat_prompt("Count from one to five.")
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    auto, plain = VLLMBackend(vllm_url, endpoint="auto"), VLLMBackend(vllm_url)
    via_auto = await auto.generate(prompt, greedy)
    via_completions = await plain.generate(prompt, greedy)
    await auto.close()
    await plain.close()
    assert auto.endpoint in ("generate", "completions")  # "completions": no tokens-only API
    assert via_auto.output_ids == via_completions.output_ids
    assert via_auto.logprobs == pytest.approx(via_completions.logprobs, abs=1e-4)


async def test_a_forwarded_abort_pause_resends_after_resume(vllm_url, chat_prompt):
    async with aiohttp.ClientSession() as client:
        async with client.get(vllm_url + "/is_paused") as resp:
            if resp.status != 200:
                pytest.skip("the server is not in dev mode (VLLM_SERVER_DEV_MODE=1)")
    router = Router(policy_version=1, config=RouterConfig(forward_pause=True))
    router.add(VLLMBackend(vllm_url, name="real"))
    prompt = chat_prompt("Write a long story about a lighthouse keeper.")
    tokens = 96  # long enough (seconds on a CPU) that the pause surely lands mid-call
    call = asyncio.create_task(
        router.session().generate(prompt, SamplingParams(temperature=0.0, max_tokens=tokens, stop_token_ids=[]))
    )
    await eventually(lambda: router.outstanding("real"), timeout=30, what="the request to be at the server")
    assert not call.done()
    report = await router.pause("abort")
    assert report["forwarded"] == {"real": "ok"} and report["in_flight"] == 0
    resumed = await router.resume(policy_version=2)
    assert resumed["forwarded"] == {"real": "ok"}
    gen = await asyncio.wait_for(call, 60)
    await router.stop()
    assert gen.policy_version == 2 and len(gen.output_ids) == tokens  # sent again, in full
    assert router.counters["aborted_by_pause"] == 1

"""The tokenizer from the serving backend (``--tokenizer vllm:URL``): vLLM's /tokenize
with messages and /detokenize give the same append-only prompts as the local
tokenizer, through the agent loop and the whole service.

Against the vLLM test double always; against a real vLLM when ROLLSERVE_VLLM_URL
points at one serving SmolLM2 (the ``vllm``-marked tests)."""

from __future__ import annotations

import copy
import socket

import httpx
import pytest

from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.trajectory import Trajectory
from rollserve.api.app import create_app
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
from rollserve.llm.tokens.chat import BackendPromptBuilder, LocalPromptBuilder
from rollserve.llm.tokens.tokenizer import ChatTokenizer, TokenizerError, load_tokenizer
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM
from tests.waiting import eventually

from .test_token_fidelity import DROP_REASONING_TEMPLATE, ScriptedEnv, assert_exact_tokens

CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "ls -la:\ntotal 0\ndrwxr-xr-x  2 root root  40 Jan  1 ."},
    {"role": "assistant", "content": "Listed 123 files."},
    {"role": "user", "content": "Now compute 4567 * 89."},
]


async def episode(server_tok, replies, turns, max_tokens=64, use_backend=True):
    """One scripted episode; the prompts come from the server's /tokenize or locally."""
    env = ScriptedEnv(turns)
    async with FakeVLLM(server_tok, replies=replies) as server:
        tokenizer = BackendTokenizer(server.url) if use_backend else server_tok
        router = Router()
        router.add(VLLMBackend(server.url, model="m"))
        trajectory = Trajectory()
        await run_agent_loop(
            env,
            router.session("t"),
            tokenizer,
            SamplingParams(max_tokens=max_tokens),
            max_turns=turns,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=LoopStats(),
        )
        await router.stop()
        if use_backend:
            await tokenizer.close()
    return trajectory, server, env


async def test_probe_render_encode_decode_match_the_local_tokenizer(tok):
    async with FakeVLLM(tok) as server:
        backend = BackendTokenizer(server.url)
        await backend.ready()
        assert backend.eos_token_id == tok.eos_token_id and backend.model == "fake-model"
        assert backend.renders_tools is False  # SmolLM2's template ignores tools
        for gen in (True, False):
            expected = tok.encode(tok.render(CONVERSATION, add_generation_prompt=gen))
            assert await backend.render_ids(CONVERSATION, gen) == expected
        ids = await backend.encode("<|im_start|>user\nhello 4567<|im_end|>")
        assert ids == tok.encode("<|im_start|>user\nhello 4567<|im_end|>")
        assert await backend.decode(ids) == "<|im_start|>user\nhello 4567<|im_end|>"
        await backend.close()


@pytest.mark.parametrize(
    "replies,max_tokens",
    [
        (["17 * 3 = 51.", "Observation noted.", "The answer is 51."], 64),
        (["Let me think about this carefully and at length before answering.", "51", "ok"], 5),
    ],
)
async def test_an_episode_has_the_same_tokens_as_with_the_local_tokenizer(tok, replies, max_tokens):
    local, _, _ = await episode(tok, replies, turns=3, max_tokens=max_tokens, use_backend=False)
    remote, server, env = await episode(tok, replies, turns=3, max_tokens=max_tokens)
    assert_exact_tokens(remote, server)
    assert remote.input_ids == local.input_ids and remote.messages == local.messages
    assert remote.fidelity.to_dict() == local.fidelity.to_dict()
    assert remote.fidelity.mismatches == 0 and remote.fidelity.fallback_deltas == 0
    assert [m["content"] for m in remote.messages if m["role"] == "assistant"] == env.replies


async def test_a_template_that_rewrites_history_falls_back_like_the_local_builder(tok):
    hf = copy.deepcopy(tok.hf)
    hf.chat_template = DROP_REASONING_TEMPLATE
    rewriting = ChatTokenizer(hf, name="drop-reasoning")
    replies = ["<think>17*3 is 51</think>It is 51.", "<think>check again</think>Yes, 51."]
    local, _, _ = await episode(rewriting, replies, turns=2, use_backend=False)
    remote, server, _ = await episode(rewriting, replies, turns=2)
    assert_exact_tokens(remote, server)
    assert remote.input_ids == local.input_ids
    assert remote.fidelity.fallback_deltas == 1 and remote.fidelity.mismatches == local.fidelity.mismatches > 0


async def test_sampled_ids_the_template_would_split_differently(tok):
    """A non-canonical split of the sampled text: ids differ from the render, so the
    delta is found on the text, exactly as the local builder finds it."""
    history = CONVERSATION[:2] + [{"role": "assistant", "content": "hello world"}]
    new = [{"role": "user", "content": "again"}]
    odd = tok.encode("hel") + tok.encode("lo world")
    assert odd != tok.encode("hello world")
    for ending in ([tok.eos_token_id], []):  # a finished turn, and one cut by max_tokens
        sequence = LocalPromptBuilder(tok).first(CONVERSATION[:2]) + odd + ending
        expected = LocalPromptBuilder(tok).delta(history, new, sequence)
        async with FakeVLLM(tok) as server:
            backend = BackendTokenizer(server.url)
            builder = backend.prompt_builder()
            assert isinstance(builder, BackendPromptBuilder)
            assert await builder.adelta(history, new, sequence) == expected
            assert builder.fidelity.fallback_deltas == 0
            await backend.close()


async def test_the_service_runs_rollouts_with_the_backend_tokenizer(tmp_path, tok):
    replies = ["Adding them: \\boxed{4}"]
    async with FakeVLLM(tok, replies=replies, latency=0.01) as fake:
        service = Service(ServerConfig(state_dir=tmp_path, tokenizer=f"vllm:{fake.url}", backends=[fake.url]))
        assert isinstance(service.tokenizer, BackendTokenizer)
        await service.start()
        assert service.tokenizer.eos_token_id == tok.eos_token_id  # probed at start
        app = create_app(service, manage_lifecycle=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            r = await client.post(
                "/v1/rollouts:run",
                json={"task": {"data_source": "math", "n": 2, "instance": {"question": "What is 2+2?", "answer": "4"}}},
            )
        await service.stop()
    results = r.json()["results"]
    assert [res["reward"] for res in results] == [1.0, 1.0]
    completions = fake.calls  # the generation calls (tokenize calls are not recorded)
    for result in results:
        tokens = result["trajectory"]["tokens"]["input_ids"]
        assert result["trajectory"]["fidelity"]["mismatches"] == 0
        assert any(tokens == c.prompt_ids + c.output_ids for c in completions)


def test_tokenizer_sources():
    assert isinstance(load_tokenizer("vllm:http://127.0.0.1:8000"), BackendTokenizer)
    assert load_tokenizer("backend:http://gpu:8000/").name == "vllm:http://gpu:8000"
    assert isinstance(load_tokenizer("smollm2"), ChatTokenizer)
    with pytest.raises(TokenizerError, match="vllm:gpu"):
        load_tokenizer("vllm:gpu")


async def test_an_unreachable_server_fails_the_call_not_the_service(tmp_path):
    service = Service(ServerConfig(state_dir=tmp_path, tokenizer="vllm:http://127.0.0.1:9"))
    await service.start()  # logs a warning; probed again on first use
    with pytest.raises(Exception) as caught:
        await service.tokenizer.ready()
    await service.stop()
    assert "127.0.0.1:9" in str(caught.value)


async def test_a_server_that_comes_up_later_is_probed_in_the_background(tmp_path, tok):
    with socket.socket() as probe:  # a free port, nothing listening on it yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = Service(ServerConfig(state_dir=tmp_path, tokenizer=f"vllm:http://127.0.0.1:{port}"))
    await service.start()  # not ready: a tool presentation now is a typed (masked) failure
    with pytest.raises(TokenizerError, match="await ready"):
        _ = service.tokenizer.renders_tools
    try:
        async with FakeVLLM(tok, port=port):

            def probed() -> bool:
                try:
                    renders = service.tokenizer.renders_tools
                except TokenizerError:  # not probed again yet
                    return False
                return renders is not None

            # first re-probe after 0.5 s, then 1, 2, 4...
            await eventually(probed, timeout=30, what="the tokenizer to be probed again")
            assert service.tokenizer.renders_tools is False  # SmolLM2's template ignores tools
            assert service.tokenizer.eos_token_id == tok.eos_token_id
    finally:
        await service.stop()


# --- a real vLLM ------------------------------------------------------------------------------
@pytest.mark.vllm
async def test_real_vllm_tokenizer_agrees_and_runs_an_episode(vllm_url, tok):
    backend = BackendTokenizer(vllm_url)
    await backend.ready()
    assert backend.eos_token_id == tok.eos_token_id and backend.renders_tools is False
    for gen in (True, False):
        assert await backend.render_ids(CONVERSATION, gen) == tok.encode(
            tok.render(CONVERSATION, add_generation_prompt=gen)
        )
    text = "<|im_start|>assistant\n4567 * 89 = 406463<|im_end|>\n"
    assert await backend.decode(await backend.encode(text)) == text
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    trajectories = []
    for tokenizer in (backend, tok):
        router = Router()
        router.add(VLLMBackend(vllm_url))
        trajectory = Trajectory()
        await run_agent_loop(
            ScriptedEnv(2),
            router.session("t"),
            tokenizer,
            greedy,
            max_turns=2,
            max_context_tokens=2048,
            trajectory=trajectory,
            stats=LoopStats(),
        )
        await router.stop()
        trajectories.append(trajectory)
    await backend.close()
    remote, local = trajectories
    assert remote.input_ids == local.input_ids and remote.fidelity.fallback_deltas == 0
    assert len(remote.turns) == 2

"""Every token backend against its server's test double: one contract, four wire formats.

Contract: the ids and logprobs a backend returns are exactly those the server sampled;
a turn cut by max_tokens finishes "length"; stop tokens end a turn; failures are
LLMError with the HTTP status, the backend's name and whether a retry may help.
"""

import pytest

from rollserve.errors import ContextWindowError, LLMError
from rollserve.llm.backends.llamacpp_server import LlamaCppServerBackend
from rollserve.llm.backends.sglang import SGLangBackend
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import LLMBackend, SamplingParams
from rollserve.testing.fake_llamacpp import FakeLlamaCpp
from rollserve.testing.fake_sglang import FakeSGLang
from rollserve.testing.fake_vllm import FakeVLLM

KINDS = {
    # kind: (server double, backend, the request field that carries max_tokens)
    "vllm": (lambda tok, **kw: FakeVLLM(tok, **kw), VLLMBackend, "max_tokens"),
    "vllm-generate": (
        lambda tok, **kw: FakeVLLM(tok, generate_endpoint=True, **kw),
        lambda url, **kw: VLLMBackend(url, endpoint="generate", **kw),
        "sampling_params.max_tokens",
    ),
    "sglang": (lambda tok, **kw: FakeSGLang(tok, **kw), SGLangBackend, "sampling_params.max_new_tokens"),
    "llamacpp": (lambda tok, **kw: FakeLlamaCpp(tok, **kw), LlamaCppServerBackend, "n_predict"),
}


SHORT = SamplingParams(max_tokens=8)


def field(request: dict, dotted: str):
    for part in dotted.split("."):
        request = request[part]
    return request


@pytest.fixture(params=list(KINDS))
def kind(request):
    return request.param


@pytest.fixture
def make(kind, tok):
    """``async with make(replies=...) as (server, backend)``."""
    make_server, make_backend, _ = KINDS[kind]

    class Pair:
        def __init__(self, **server_kwargs):
            self.server = make_server(tok, **server_kwargs)

        async def __aenter__(self):
            await self.server.start()
            self.backend = make_backend(self.server.url)
            return self.server, self.backend

        async def __aexit__(self, *exc):
            await self.backend.close()
            await self.server.close()

    return Pair


async def test_ids_and_logprobs_are_what_the_server_sampled(make, kind, tok, chat_prompt):
    prompt = chat_prompt()
    async with make(replies=["The answer is 4."]) as (server, backend):
        assert isinstance(backend, LLMBackend) and backend.trainable
        gen = await backend.generate(prompt, SamplingParams(max_tokens=64, seed=5))
        assert backend.outstanding == 0
    [call] = server.calls
    assert call.prompt_ids == prompt
    assert gen.output_ids == call.output_ids == tok.encode("The answer is 4.") + [tok.eos_token_id]
    assert gen.logprobs == call.logprobs  # exact floats, through JSON and back
    assert gen.finish_reason == "stop" and gen.backend == backend.name


async def test_a_turn_cut_by_max_tokens_finishes_length(make, kind, tok, chat_prompt):
    async with make(replies="one two three four five six seven") as (server, backend):
        gen = await backend.generate(chat_prompt(), SamplingParams(max_tokens=4))
    assert gen.finish_reason == "length" and len(gen.output_ids) == 4
    assert tok.eos_token_id not in gen.output_ids
    assert field(server.calls[0].request, KINDS[kind][2]) == 4


async def test_stop_token_ids_end_the_turn(make, kind, tok, chat_prompt):
    reply = tok.encode("alpha beta gamma delta")
    async with make(replies="alpha beta gamma delta") as (server, backend):
        gen = await backend.generate(chat_prompt(), SamplingParams(stop_token_ids=[reply[1]]))
    assert gen.output_ids == reply[:2] and gen.finish_reason == "stop"
    assert gen.logprobs == server.calls[0].logprobs[:2]


async def test_failures_are_typed(make, kind, chat_prompt):
    async with make(max_model_len=200) as (server, backend):
        server.fail_next(1, status=503)
        with pytest.raises(LLMError, match="503") as info:
            await backend.generate(chat_prompt(), SHORT)
        assert (info.value.status, info.value.retryable, info.value.backend) == (503, True, backend.name)
        server.fail_next(1, mode="close")
        with pytest.raises(LLMError, match="Disconnected") as info:
            await backend.generate(chat_prompt(), SHORT)
        assert info.value.retryable and info.value.status is None
        calls = len(server.calls)
        with pytest.raises(ContextWindowError) as info:  # cannot fit: refused before sending
            await backend.generate([1] * 250, SHORT)
        assert not info.value.retryable and len(server.calls) == calls
        with pytest.raises(LLMError, match="empty prompt"):
            await backend.generate([], SHORT)
        assert await backend.health()
        assert (await backend.generate(chat_prompt(), SHORT)).output_ids
    assert not await backend.health()  # the server is gone
    with pytest.raises(LLMError, match="failed") as info:
        await backend.generate(chat_prompt(), SHORT)
    assert info.value.retryable


async def test_describe(make, kind):
    async with make() as (server, backend):
        info = backend.describe()
    assert info["name"] == backend.name and info["url"] == server.url
    assert info["trainable"] is True and info["outstanding"] == 0
    assert info["kind"] == kind.split("-")[0]


# --- per server -----------------------------------------------------------------------
async def test_vllm_generate_request_and_auto_fallback(tok, chat_prompt):
    prompt = chat_prompt()
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=9, seed=1)
    async with FakeVLLM(tok, generate_endpoint=True) as server:
        backend = VLLMBackend(server.url, endpoint="auto")
        await backend.generate(prompt, sampling)
        assert backend.endpoint == "generate" and backend.describe()["endpoint"] == "generate"
        await backend.close()
    sent = server.calls[0].request
    assert server.calls[0].route == "/inference/v1/generate"
    assert sent["token_ids"] == prompt and sent["stream"] is False and sent["model"] == "fake-model"
    assert sent["sampling_params"] == {
        "max_tokens": 9,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 1,
        "logprobs": 0,
        "detokenize": False,
    }
    async with FakeVLLM(tok) as server:  # no tokens-only API on this one
        backend = VLLMBackend(server.url, endpoint="auto")
        gen = await backend.generate(prompt, sampling)
        assert backend.endpoint == "completions" and gen.output_ids == server.calls[0].output_ids
        await backend.generate(prompt, sampling)
        await backend.close()
    assert [c.route for c in server.calls] == ["/v1/completions"] * 2


async def test_sglang_request_shape_and_checks(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeSGLang(tok, replies="hello there") as server:
        backend = SGLangBackend(server.url)
        gen = await backend.generate(prompt, SamplingParams(temperature=0.5, top_k=-1, seed=3))
        await backend.close()
    sent = server.calls[0].request
    assert sent["input_ids"] == prompt and sent["return_logprob"] is True
    assert sent["logprob_start_len"] == -1 and sent["stream"] is False
    assert sent["sampling_params"]["max_new_tokens"] == 512
    assert sent["sampling_params"]["sampling_seed"] == 3 and sent["sampling_params"]["top_k"] == -1
    assert "max_tokens" not in sent["sampling_params"]  # SGLang would reject it
    assert gen.meta["finish"] == {"type": "stop", "matched": tok.eos_token_id}

    backend = SGLangBackend("http://127.0.0.1:9")
    triples = [[-0.5, 7, None], [-0.25, 2, None]]
    ok = {
        "output_ids": [7, 2],
        "meta_info": {
            "output_token_logprobs": triples,
            "prompt_tokens": 2,
            "finish_reason": {"type": "length", "length": 2},
        },
    }
    assert backend._parse(ok, [1, 2]).finish_reason == "length"
    no_ids = {"meta_info": {**ok["meta_info"]}}  # an older server: ids only in the triples
    assert backend._parse(no_ids, [1, 2]).output_ids == [7, 2]
    with pytest.raises(LLMError, match="differ from output_ids") as info:
        backend._parse({**ok, "output_ids": [7, 3]}, [1, 2])
    assert not info.value.retryable
    with pytest.raises(LLMError, match="prompt tokens"):
        backend._parse(ok, [1, 2, 3])
    aborted = {**ok, "meta_info": {**ok["meta_info"], "finish_reason": {"type": "abort"}}}
    assert backend._parse(aborted, [1, 2]).finish_reason == "abort"


async def test_llamacpp_request_shape_and_utf8_gaps(tok, chat_prompt):
    prompt = chat_prompt()
    async with FakeLlamaCpp(tok, replies=["plain", "a parrot 🦜 here"]) as server:
        backend = LlamaCppServerBackend(server.url)
        await backend.generate(prompt, SamplingParams(max_tokens=30, seed=2))
        # "🦜" is three tokens here; llama.cpp has no probabilities for the first two.
        with pytest.raises(LLMError, match="UTF-8") as info:
            await backend.generate(prompt, SamplingParams(max_tokens=30))
        assert info.value.retryable
        await backend.close()
    sent = server.calls[0].request
    assert sent["prompt"] == prompt and sent["n_predict"] == 30 and sent["seed"] == 2
    assert (sent["n_probs"], sent["return_tokens"], sent["post_sampling_probs"]) == (1, True, False)
    assert (sent["top_k"], sent["min_p"], sent["repeat_penalty"]) == (0, 0.0, 1.0)

    backend = LlamaCppServerBackend("http://127.0.0.1:9")
    probs = [{"id": 7, "logprob": -0.5}, {"id": 2, "logprob": -0.1}]
    good = {"tokens": [7, 2], "completion_probabilities": probs, "stop_type": "eos", "tokens_evaluated": 3}
    assert backend._parse(good, [1, 2, 3]).logprobs == [-0.5, -0.1]
    with pytest.raises(LLMError, match="evaluated 3 prompt tokens"):
        backend._parse(good, [1, 2])
    with pytest.raises(LLMError, match="return_tokens"):
        backend._parse({"completion_probabilities": probs}, [1, 2, 3])
    with pytest.raises(LLMError, match="post_sampling_probs"):
        backend._parse({**good, "completion_probabilities": [{"id": 7, "prob": 0.6}]}, [1, 2, 3])


@pytest.mark.parametrize(
    "make_server,make_backend",
    [
        (lambda tok: FakeVLLM(tok, dev_mode=True), VLLMBackend),
        (lambda tok: FakeSGLang(tok), SGLangBackend),
    ],
)
async def test_pause_and_resume_reach_the_server(tok, make_server, make_backend):
    async with make_server(tok) as server:
        backend = make_backend(server.url)
        await backend.pause("abort")
        assert server.paused
        await backend.resume()
        await backend.pause("finish")
        await backend.resume()
        await backend.close()
    assert not server.paused
    expected = ["abort", "wait"] if isinstance(server, FakeVLLM) else ["abort", "in_place"]
    assert server.pauses == expected

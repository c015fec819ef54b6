"""The whole service against a real vLLM server serving SmolLM2-135M-Instruct.

rollserve's API, engine, math handler, agent loop, router and vLLM backend, driven
over HTTP (in-process) exactly as a trainer would, against vLLM itself. Besides the
usual checks, every sampled token's logprob is checked against what vLLM computes for
that token when it reads the whole trajectory back as a prompt: a trainer recomputing
logprobs of these ids with the same weights must find what rollserve reported.

Skipped unless ROLLSERVE_VLLM_URL points at one; scripts/vllm_cpu/start.sh starts one
(CPU, about 30 s once installed) and prints the URL:

    ROLLSERVE_VLLM_URL=http://127.0.0.1:8011 pytest -m vllm
"""

import difflib

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.server import ServerConfig, Service

pytestmark = pytest.mark.vllm  # `api` takes `vllm_url` (tests/real_vllm.py): skips without one

TASKS = [
    {"data_source": "math", "n": 2, "instance": {"question": "What is 7 * 6?", "answer": "42"}},
    {"data_source": "math", "n": 2, "instance": {"question": "What is 15 + 27?", "answer": "42"}},
]
# Short turns keep the test well under a minute on two CPU cores (~11 tokens/s per
# stream); two turns exercise the append-only prompt (a reply without \boxed{} gets a
# retry message, and the second prompt extends the first).
SAMPLING = {"temperature": 1.0, "max_tokens": 48}

# The same fp32 weights, but a sampled token's logprob comes from a decode step (one
# new token against the KV cache, batched with the other rollouts' steps) and the
# check's from one prefill of the whole sequence: different kernels and summation
# orders. Measured on vLLM 0.32 CPU (6 runs, ~1,900 tokens): at most 3.1e-5 apart,
# mean ~1e-6. 1e-3 leaves 30x room for other CPUs and batch mixes and still catches
# any real error: logprobs shifted by one position differ by ~1 nat (median; 99% of
# them by more than 1e-3), and a wrong token or prompt shifts them as much.
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture
async def api(tmp_path, vllm_url):
    service = Service(ServerConfig(state_dir=tmp_path / "state", backends=[vllm_url]))
    await service.start()
    app = create_app(service, manage_lifecycle=False)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollserve", timeout=120)
    try:
        yield client
    finally:
        await client.aclose()
        await service.stop()


async def _submit_and_collect(api: httpx.AsyncClient) -> list[dict]:
    r = await api.post("/v1/rollouts", json={"tasks": TASKS, "sampling": SAMPLING, "agent": {"max_turns": 2}})
    assert r.status_code == 202, r.text
    groups = r.json()["groups"]
    assert [len(g["rollout_ids"]) for g in groups] == [2, 2]
    results = []
    for group in groups:
        view = (await api.get(f"/v1/groups/{group['group_id']}", params={"wait": 120})).json()
        assert view["done"], view
        results += [item["result"] for item in view["rollouts"]]
    return results


async def _vllm_prompt_logprobs(vllm: httpx.AsyncClient, model: str, ids: list[int]) -> list:
    """vLLM's own logprob of each of ``ids`` given the ids before it (None for the first)."""
    r = await vllm.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,  # the prompt token's own logprob, no alternatives
            "return_token_ids": True,  # echo the prompt ids: vLLM read what we sent
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == ids
    # vLLM 0.32: [None, {"<id>": {"logprob": x, "rank": r, "decoded_token": s}}, ...]
    per_position = choice["prompt_logprobs"]
    assert len(per_position) == len(ids) and per_position[0] is None
    return [None] + [entry[str(token)]["logprob"] for entry, token in zip(per_position[1:], ids[1:])]


async def _vllm_tokenize(vllm: httpx.AsyncClient, messages: list[dict]) -> list[int]:
    r = await vllm.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


async def check_exact(
    vllm: httpx.AsyncClient, model: str, backend: dict, result: dict, against_tokenize: bool = True
) -> tuple[float, int]:
    """A result's trajectory is exactly what vLLM sampled: (worst |logprob diff|, compared)."""
    assert result["status"] == "completed", result["failure"]
    assert result["mask"] is False
    trajectory = result["trajectory"]
    tokens = trajectory["tokens"]
    ids, mask, logprobs = tokens["input_ids"], tokens["loss_mask"], tokens["logprobs"]
    assert len(ids) == len(mask) == len(logprobs)
    fidelity = trajectory["fidelity"]
    assert fidelity["append_only"] and fidelity["template_checked"], fidelity
    if against_tokenize:
        # Template-side tokens agree with vLLM's own chat template: every token
        # that differs from vLLM's /tokenize of the conversation is one the policy
        # sampled (a non-canonical split at temperature 1.0 is kept as sampled).
        served = await _vllm_tokenize(vllm, trajectory["messages"])
        for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=ids, b=served, autojunk=False).get_opcodes():
            if tag in ("replace", "delete"):
                assert all(mask[i1:i2]), (tag, i1, i2, ids[i1:i2])

    # The turns tile the sequence: prompt delta, then the sampled ids (mask 1).
    position = 0
    for turn in trajectory["turns"]:
        assert turn["backend"] == backend["name"]
        position += len(turn["prompt_ids_delta"])
        end = position + len(turn["output_ids"])
        assert ids[position:end] == turn["output_ids"]
        assert logprobs[position:end] == turn["logprobs"]
        assert mask[position:end] == [1] * len(turn["output_ids"])
        position = end
    assert position == len(ids)
    assert sum(mask) == result["stats"]["output_tokens"] > 0

    # The strong check: vLLM's logprob of each sampled id, recomputed from the
    # whole trajectory, is the one rollserve reported.
    expected = await _vllm_prompt_logprobs(vllm, model, ids)
    worst, compared = 0.0, 0
    for i, sampled in enumerate(mask):
        if sampled:
            diff = abs(logprobs[i] - expected[i])
            assert diff <= LOGPROB_TOLERANCE, (
                f"{result['id']} position {i} (token {ids[i]}): rollserve reported "
                f"{logprobs[i]}, vLLM computes {expected[i]}"
            )
            worst, compared = max(worst, diff), compared + 1
    return worst, compared


async def test_rollouts_carry_exactly_what_vllm_sampled(api, vllm_url):
    (backend,) = (await api.get("/v1/llm/backends")).json()["backends"]
    assert backend["kind"] == "vllm"
    results = await _submit_and_collect(api)
    assert len(results) == 4

    async with httpx.AsyncClient(base_url=vllm_url, timeout=120) as vllm:
        model = (await vllm.get("/v1/models")).json()["data"][0]["id"]
        worst, compared = 0.0, 0
        for result in results:
            diff, count = await check_exact(vllm, model, backend, result)
            worst, compared = max(worst, diff), compared + count
    print(f"compared {compared} sampled logprobs with vLLM's prefill: max |diff| {worst:.2e}")


async def test_a_swe_rollout_on_real_vllm_is_exact_and_scored(api, vllm_url):
    """A swe-mini instance end to end on the real model: repository in bubblewrap, tool
    episode (whatever the small model does with it), candidate patch, evaluation."""
    from rollserve.datasets import SWE_MINI
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime

    if BubblewrapRuntime.unavailable_reason() is not None:
        pytest.skip(f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}")
    (backend,) = (await api.get("/v1/llm/backends")).json()["backends"]
    row = SWE_MINI.rows()[0]
    r = await api.post(
        "/v1/rollouts:run",
        json={
            "task": {"data_source": "swe", "instance": row},
            "sampling": {"temperature": 1.0, "max_tokens": 48},
            "agent": {"max_turns": 2, "max_context_tokens": 8192},
            "wait": 240,
        },
    )
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    evaluation = result["evaluation"]
    assert evaluation["instance_id"] == row["instance_id"] and "git_patch" in evaluation
    assert result["reward"] == (1.0 if evaluation.get("resolved") else 0.0)
    async with httpx.AsyncClient(base_url=vllm_url, timeout=120) as vllm:
        model = (await vllm.get("/v1/models")).json()["data"][0]["id"]
        # (The tools reach the template through its `tools`, which /tokenize is not given.)
        await check_exact(vllm, model, backend, result, against_tokenize=False)

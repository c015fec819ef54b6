"""A real harness on the embedded SmolLM2-135M model, end to end through the HTTP API:
mini-swe-agent, the preset whose first prompt is the smallest (~1,330 tokens with
SmolLM2's tokenizer: it fits the embedded model's 4,096-token ``n_ctx``; see the
presets' ``[prompt]`` tables), runs unmodified in a bubblewrap sandbox and calls the
real model through the gateway. The small model will not solve anything: what is
checked is the run (it ends, typed, within its bounds), the recording (every token
the model sampled is in the result, verbatim, with its logprob and loss_mask 1, against
a log taken at the backend itself) and the masking (the harness's prompt tokens,
its system prompt first, are loss_mask 0; nothing else is 1)."""

from __future__ import annotations

import importlib.util

import pytest

from rollserve.agent.harnesses.base import presets
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.e2e.test_gateway_api import result
from tests.e2e.test_harness_swe_api import mini_version

pytestmark = [
    pytest.mark.embedded,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="the embedded model needs the 'local' extra (llama-cpp-python)",
    ),
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
    pytest.mark.skipif(
        not mini_version().startswith("2.4."), reason=f"the preset is for mini-swe-agent 2.4.x, not {mini_version()!r}"
    ),
]

N_CTX = 4096  # the embedded backend's default n_ctx
MAX_TURNS = 2


def smallest_fitting() -> str:
    """The bundled preset with the smallest measured first prompt: mini-swe-agent."""
    sized = {name: p.prompt.first_tokens for name, p in presets().items() if p.prompt is not None}
    return min(sized, key=sized.__getitem__)


def laid_out(turns: list[dict], sequence: int) -> tuple[list[int], list[int], list[float]]:
    """A sequence as its turns say: each turn's prompt delta (0), then its sample (1)."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn in (t for t in turns if t["sequence"] == sequence):
        ids += turn["prompt_ids_delta"] + turn["output_ids"]
        mask += [0] * len(turn["prompt_ids_delta"]) + [1] * len(turn["output_ids"])
        logprobs += [0.0] * len(turn["prompt_ids_delta"]) + turn["logprobs"]
    return ids, mask, logprobs


async def test_mini_swe_agent_runs_on_the_embedded_smollm2_recorded_and_masked(make_api):
    assert smallest_fitting() == "mini-swe-agent"
    service, client = await make_api(["embedded"])
    (state,) = service.router.states()
    backend = state.backend
    assert backend.context_window() == N_CTX
    sampled: list[tuple[list[int], list[int], list[float]]] = []  # at the backend itself
    generate = backend.generate

    async def logged(prompt_ids, sampling):
        generation = await generate(prompt_ids, sampling)
        sampled.append((list(prompt_ids), list(generation.output_ids), list(generation.logprobs)))
        return generation

    backend.generate = logged  # type: ignore[method-assign]
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {
                    "data_source": "gateway",
                    "instance": {
                        "answer": "hello",
                        "task": "Print the word hello.",
                        "harness": {"preset": "mini-swe-agent"},
                    },
                }
            ],
            "sampling": {"max_tokens": 32, "temperature": 0.7, "seed": 7},
            "agent": {"max_turns": MAX_TURNS, "max_context_tokens": N_CTX},
            "timeouts": {"run": 120},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)

    # The run: it ended, and typed. The small model's words decide how (a reply that is
    # not "hello" scores 0, max_turns, an exit of the harness...), never an untyped
    # error; and the harness called the model (else nothing below would be checked).
    assert done["status"] in ("completed", "failed", "truncated"), done["status"]
    if done["failure"] is not None:
        assert done["failure"]["kind"] != "internal", done["failure"]
    log = (done["evaluation"] or {}).get("harness_log_tail")
    assert sampled, (done["failure"], log)
    assert 1 <= len(sampled) <= MAX_TURNS
    trajectory = done["trajectory"]
    turns = trajectory["turns"]
    assert all(t["backend"] == "embedded" for t in turns)

    # The recording: the turns are the backend's samples, call for call, verbatim.
    assert [(t["output_ids"], t["logprobs"]) for t in turns] == [(o, lp) for _, o, lp in sampled]
    sequences = trajectory["sequences"] or [trajectory["tokens"]]
    assert len(sequences) == trajectory["sequence_count"]
    for index, sequence in enumerate(sequences):
        ids, mask, logprobs = laid_out(turns, index)
        assert sequence["input_ids"] == ids and sequence["loss_mask"] == mask
        assert sequence["logprobs"] == logprobs
    # Each call's prompt is the sequence so far: prompt ids as sent, samples as sampled.
    first_prompt, _, _ = sampled[0]
    seq0 = sequences[0]
    assert seq0["input_ids"][: len(first_prompt)] == first_prompt
    # The masking: the harness's whole first prompt (its system prompt, tools, the task),
    # about what its preset measured, is loss_mask 0; 1 exactly on the sampled ids.
    measured = presets()["mini-swe-agent"].prompt
    assert measured is not None and len(first_prompt) >= measured.first_tokens
    assert seq0["loss_mask"][: len(first_prompt)] == [0] * len(first_prompt)
    assert sum(sum(s["loss_mask"]) for s in sequences) == sum(len(o) for _, o, _ in sampled)
    assert done["stats"]["output_tokens"] == sum(len(o) for _, o, _ in sampled)
    assert all(lp <= 0.0 for _, _, lps in sampled for lp in lps)
    opening = service.tokenizer.decode(first_prompt)
    assert "Print the word hello." in opening and "<|im_start|>system" in opening
    assert service.sandboxes.open_sandboxes() == []

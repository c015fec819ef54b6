"""rollserve.integrations.verl_rows: a verl row's task, and a result as verl's fields
(no verl needed; the loop itself runs in tests/integrations/test_verl_loop.py)."""

import json

import pytest

from rollserve.client import AsyncClient
from rollserve.contract import (
    AgentLimits,
    Fidelity,
    RolloutResult,
    SamplingParams,
    Stats,
    Timing,
    Tokens,
    Trajectory,
    Turn,
)
from rollserve.integrations.tensors import to_sample
from rollserve.integrations.verl_rows import (
    Attempts,
    LoopSettings,
    VerlTaskError,
    batch_sampling,
    fit_limits,
    register_servers,
    task_from_row,
    to_verl,
    verl_row,
)

TASK = {
    "data_source": "math",
    "instance": {"question": "What is 2 + 2?", "answer": "4"},
    "agent": {"max_turns": 3},
    "metadata": {"row": 7},
}


def test_a_row_carries_its_task_through_parquet_shapes():
    row = verl_row(TASK, index=5, prompt="2 + 2?")
    assert row["data_source"] == "math" and row["agent_name"] == "rollserve"
    assert row["prompt"] == [{"role": "user", "content": "2 + 2?"}]
    assert row["extra_info"]["index"] == 5
    assert isinstance(row["extra_info"]["rollserve"], str)  # one Arrow type for every row
    task = task_from_row(row["data_source"], row["extra_info"])
    assert task.model_dump(exclude_unset=True) == {**TASK, "n": 1}
    # an object works too; keys Arrow filled with null are dropped
    same = task_from_row(
        "math",
        {
            "rollserve": {
                "instance": TASK["instance"],
                "agent": {"max_turns": 3},
                "metadata": {"row": 7},
                "sampling": None,
            }
        },
    )
    assert same == task
    # the instance as a JSON string
    assert (
        task_from_row(
            "math",
            {
                "rollserve": {
                    "instance": json.dumps(TASK["instance"]),
                    "agent": {"max_turns": 3},
                    "metadata": {"row": 7},
                }
            },
        )
        == task
    )


@pytest.mark.parametrize(
    ("data_source", "extra_info", "field"),
    [
        (None, {"rollserve": {"instance": {}}}, "data_source"),
        ("math", {"index": 1}, "extra_info.rollserve"),
        ("math", None, "extra_info.rollserve"),
        ("math", {"rollserve": "{not json"}, "extra_info.rollserve: not valid JSON"),
        ("math", {"rollserve": "[1]"}, "extra_info.rollserve"),
        ("math", {"rollserve": {"instance": {}, "id": "old"}}, "extra_info.rollserve.id"),
        ("math", {"rollserve": {"instance": {}, "n": 8}}, "extra_info.rollserve.n"),
        ("math", {"rollserve": {"instance": "{x"}}, "extra_info.rollserve.instance"),
        ("math", {"rollserve": {"instance": {}, "sampling": {"temprature": 1}}}, "temprature"),
    ],
)
def test_a_bad_row_is_refused_by_field(data_source, extra_info, field):
    with pytest.raises(VerlTaskError, match=field.replace(".", r"\.").replace("{", r"\{")):
        task_from_row(data_source, extra_info)


def test_verls_sampling_goes_over_the_loops_and_the_context_fits_verls_lengths():
    settings = LoopSettings(
        url="http://x",
        sampling=SamplingParams(max_tokens=99, temperature=0.5),
        agent=AgentLimits(max_context_tokens=3000),
    )
    sampling = batch_sampling(
        settings, {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    )
    assert sampling.model_dump(exclude_unset=True) == {"max_tokens": 99, "temperature": 0, "top_p": 1.0, "top_k": -1}
    with pytest.raises(ValueError, match="repetition_penalty"):
        batch_sampling(settings, {"repetition_penalty": 1.1})
    task = task_from_row("math", verl_row(TASK, 0)["extra_info"])
    assert fit_limits(task, settings, 4096).agent == AgentLimits(max_turns=3, max_context_tokens=3000)
    assert fit_limits(task, settings, 1024).agent == AgentLimits(max_turns=3, max_context_tokens=1024)
    for field, bad in (
        ("url", {"url": ""}),
        ("timeout", {"url": "http://x", "timeout": 0}),
        ("masked_retries", {"url": "http://x", "masked_retries": -1}),
    ):
        with pytest.raises(ValueError, match=field):
            LoopSettings(**bad)


def _result(mask: bool = False, reward: float | None = 1.0) -> RolloutResult:
    turns = [
        Turn(
            prompt_ids_delta=[1, 2, 3], output_ids=[10, 11], logprobs=[-0.5, -0.25], finish_reason="stop", backend="b"
        ),
        Turn(prompt_ids_delta=[4, 5], output_ids=[12], logprobs=[-1.0], finish_reason="stop", backend="b"),
    ]
    tokens = Tokens(
        input_ids=[1, 2, 3, 10, 11, 4, 5, 12],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0],
    )
    trajectory = Trajectory(
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "b"},
        ],
        turns=turns,
        tokens=tokens,
        fidelity=Fidelity(),
        policy_versions=[],
        trainable=True,
        ended_by="finished",
        tools=None,
    )
    return RolloutResult(
        id="r",
        group_id="g",
        task_id="g",
        data_source="math",
        sample_index=0,
        status="timed_out" if mask else "completed",
        reward=reward,
        evaluation=None,
        failure=None,
        mask=mask,
        mask_reason="run timed out" if mask else None,
        stale=False,
        trajectory=trajectory,
        timing=Timing(run=2.0, eval=0.5, total=3.0, llm=1.5, tools=0.25),
        stats=Stats(turns=2, prompt_tokens=5, output_tokens=3, truncated_turns=0),
        attempt=1,
        metadata={},
    )


def test_a_results_reward_components_pass_through_to_verl_and_trl_rows():
    result = _result().model_copy(update={"reward_components": {"correctness": 1.0, "format": 0.5}})
    out = to_verl(Attempts(result, 1, ["g"]), prompt_length=8, response_length=8, filler_id=2)
    assert out.info["reward_components"] == {"correctness": 1.0, "format": 0.5}
    sample = to_sample(result, filler_id=2)
    assert sample.reward_components == {"correctness": 1.0, "format": 0.5}
    masked = _result(mask=True, reward=None).model_copy(update={"reward_components": {"x": 1.0}})
    assert to_sample(masked, filler_id=2).reward_components is None  # nothing to train on
    # one rule: the info a trainer logs carries them where the sample does, None when masked
    assert to_sample(masked, filler_id=2).info["reward_components"] is None
    assert (
        to_verl(Attempts(masked, 1, ["g"]), prompt_length=8, response_length=8, filler_id=2).info["reward_components"]
        is None
    )


def test_a_result_as_verls_fields():
    out = to_verl(Attempts(_result(), 1, ["g"]), prompt_length=8, response_length=8, filler_id=2)
    assert (out.prompt_ids, out.response_ids) == ([1, 2, 3], [10, 11, 4, 5, 12])
    assert out.response_mask == [1, 1, 0, 0, 1]
    assert out.response_logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert (out.reward_score, out.masked, out.reason, out.num_turns) == (1.0, False, None, 4)
    assert out.metrics == {"generate_sequences": 1.5, "tool_calls": 0.25, "compute_score": 0.5}
    assert out.info["timing"]["total"] == 3.0 and out.info["attempts"] == 1


def test_masked_timed_out_and_over_length_samples_get_no_gradient():
    masked = to_verl(Attempts(_result(mask=True, reward=None), 2, ["g1", "g2"]), 8, 8, 2)
    assert masked.response_ids == [10, 11, 4, 5, 12] and masked.response_mask == [0] * 5
    assert (masked.reward_score, masked.masked, masked.reason) == (0.0, True, "run timed out")
    late = to_verl(Attempts(None, 1, ["g"]), 8, 8, 2)
    assert (late.prompt_ids, late.response_ids, late.response_mask) == ([2], [2], [0])
    assert (late.reward_score, late.reason) == (0.0, "timeout")
    # the policy earned its reward with tokens verl would not see: cut to fit, and masked
    long = to_verl(Attempts(_result(), 1, ["g"]), prompt_length=2, response_length=3, filler_id=2)
    assert (long.prompt_ids, long.response_ids, long.response_mask) == ([2, 3], [10, 11, 4], [0, 0, 0])
    assert (long.reward_score, long.masked, long.reason) == (0.0, True, "over_length")


async def test_verl_servers_of_an_engine_rollserve_has_no_kind_for_are_refused():
    async with AsyncClient("http://127.0.0.1:9") as client:  # never called
        with pytest.raises(ValueError, match="actor_rollout_ref.rollout.name"):
            await register_servers(client, ["127.0.0.1:1"], "trtllm")
    with pytest.raises(ValueError, match="backends"):
        LoopSettings(url="http://x", backends="theirs")

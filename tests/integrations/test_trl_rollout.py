"""rollserve.integrations.trl against a live rollserve and a scripted fake vLLM: the
rollout function called as TRL 1.16's GRPOTrainer calls it (``rollout_func(prompts,
trainer)``, this process's prompts, each repeated num_generations times in a row)."""

import asyncio
from dataclasses import dataclass, field

import pytest

from rollserve.client import Client
from rollserve.contract import RolloutResult, SamplingParams
from rollserve.integrations.trl import (
    IncompleteGroupError,
    TaskPromptError,
    rollout_func,
    rollserve_reward,
    task_prompt,
)

EOS = 2
TWO = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
THREE = {
    "data_source": "math",
    "instance": '{"question": "What is 1 + 2?", "answer": "3"}',
    "agent": {"max_turns": 3},
    "metadata": {"row": 7},
}


@dataclass
class Module:
    training: bool = True


@dataclass
class Accelerator:
    process_index: int = 0


@dataclass
class Trainer:
    """The attributes of GRPOTrainer the rollout function reads."""

    num_generations: int = 2
    num_generations_eval: int = 1
    eos_token_ids: list[int] = field(default_factory=lambda: [EOS])
    model: Module = field(default_factory=Module)
    accelerator: Accelerator = field(default_factory=Accelerator)


def two_turns(prompt_ids: list[int], text: str) -> str:
    """Each episode: a reply without an answer, then the answer 4."""
    return "So the answer is \\boxed{4}." if "four" in text else "I think it is four."


def _check_required(output: dict, prompts: list[str]) -> None:
    """What TRL's _generate checks and then relies on."""
    assert {"prompt_ids", "completion_ids", "logprobs"} <= output.keys()
    for key, values in output.items():
        assert isinstance(values, list) and len(values) == len(prompts), key
    for ids, logprobs, mask in zip(output["completion_ids"], output["logprobs"], output["env_mask"], strict=True):
        assert ids and len(ids) == len(logprobs) == len(mask)


def _stored(client: Client, rollout_id: str) -> RolloutResult:
    view = client.rollout(rollout_id)
    assert view.result is not None
    return view.result


def test_tokens_are_rollserves_exactly(server_factory, fake_llm_thread):
    fake = fake_llm_thread(replies=two_turns)
    server = server_factory("--backend", fake.url).start(timeout=180)
    prompts = [task_prompt(TWO)] * 2 + [task_prompt(THREE)] * 2
    with Client(server.url) as client:
        output = rollout_func(client, sampling=SamplingParams(max_tokens=64), timeout=120)(prompts, Trainer())
        _check_required(output, prompts)
        groups = output["rollserve_group_id"]
        assert groups[0] == groups[1] != groups[2] == groups[3]
        assert output["rollserve_reward"] == [1.0, 1.0, 0.0, 0.0]
        assert output["rollserve_masked"] == [False] * 4
        assert [info["metadata"] for info in output["rollserve_info"]] == [{}, {}, {"row": 7}, {"row": 7}]
        calls = {tuple(call.prompt_ids): call for call in fake.calls}
        for i, rollout_id in enumerate(output["rollserve_id"]):
            result = _stored(client, rollout_id)
            tokens, turns = result.trajectory.tokens, result.trajectory.turns
            assert len(turns) == 2
            cut = len(turns[0].prompt_ids_delta)
            assert output["prompt_ids"][i] == turns[0].prompt_ids_delta == tokens.input_ids[:cut]
            assert output["prompt_ids"][i] + output["completion_ids"][i] == tokens.input_ids
            assert output["env_mask"][i] == tokens.loss_mask[cut:]
            assert output["logprobs"][i] == tokens.logprobs[cut:]
            # environment tokens: mask 0, logprob 0.0; sampled ones: what the backend sent
            completion = output["completion_ids"][i]
            position = 0
            for turn in turns:
                delta = turn.prompt_ids_delta if position else []
                span = slice(position + len(delta), position + len(delta) + len(turn.output_ids))
                assert output["env_mask"][i][position : span.start] == [0] * len(delta)
                assert output["logprobs"][i][position : span.start] == [0.0] * len(delta)
                assert completion[span] == turn.output_ids
                assert output["env_mask"][i][span] == [1] * len(turn.output_ids)
                context = output["prompt_ids"][i] + completion[: span.start]
                assert calls[tuple(context)].output_ids == turn.output_ids
                assert output["logprobs"][i][span] == calls[tuple(context)].logprobs
                position = span.stop
            assert position == len(completion)
        assert rollserve_reward(prompts, [None] * 4, **output) == [1.0, 1.0, 0.0, 0.0]


def test_a_masked_rollout_gives_no_gradient_and_no_reward(server_factory, fake_llm_thread):
    async def reply(prompt_ids: list[int], text: str) -> str:
        if "four" in text:  # the second turn never comes back: the run stage times out
            await asyncio.sleep(120)
        return "I think it is four."

    fake = fake_llm_thread(replies=reply)
    server = server_factory("--backend", fake.url).start(timeout=180)
    prompts = [task_prompt({**TWO, "timeouts": {"run": 3}})] * 2
    with Client(server.url) as client:
        output = rollout_func(client, sampling=SamplingParams(max_tokens=64), timeout=120)(prompts, Trainer())
        _check_required(output, prompts)
        assert output["rollserve_masked"] == [True, True]
        assert output["rollserve_reward"] == [None, None]
        assert rollserve_reward(prompts, [None] * 2, **output) == [None, None]
        for i, rollout_id in enumerate(output["rollserve_id"]):
            result = _stored(client, rollout_id)
            assert result.mask and result.reward is None, result
            cut = len(output["prompt_ids"][i])
            # the policy did sample tokens (the first turn), and none of them is trained on
            assert sum(result.trajectory.tokens.loss_mask[cut:]) > 0
            assert output["prompt_ids"][i] + output["completion_ids"][i] == result.trajectory.tokens.input_ids
            assert output["env_mask"][i] == [0] * len(output["completion_ids"][i])


def test_fewer_samples_than_asked_is_an_error_naming_the_group(server_factory, fake_llm_thread):
    fake = fake_llm_thread(replies=["\\boxed{4}"], latency=60)
    server = server_factory("--backend", fake.url).start(timeout=180)
    prompts = [task_prompt(TWO)] * 2
    with Client(server.url) as client:
        with pytest.raises(IncompleteGroupError) as caught:
            rollout_func(client, timeout=2)(prompts, Trainer())
        error = caught.value
        assert (error.asked, error.got) == (2, 0) and error.group_id in str(error)
        # the trainer gave up on it: nothing of it keeps running on the server
        view = client.wait_group(error.group_id, timeout=60)
        assert view.done and view.status_counts == {"cancelled": 2}


def test_each_process_gets_its_slice_and_groups_straddle_processes(server_factory, fake_llm_thread):
    fake = fake_llm_thread(replies=["\\boxed{4}"])
    server = server_factory("--backend", fake.url).start(timeout=180)
    # num_generations=2, 3 prompts a process: process 1 holds positions 3, 4 and 5, that
    # is the second half of group 1 (TWO) and the whole of group 2 (THREE).
    prompts = [task_prompt(TWO), task_prompt(THREE), task_prompt(THREE)]
    with Client(server.url) as client:
        func = rollout_func(client, timeout=120)
        output = func(prompts, Trainer(accelerator=Accelerator(process_index=1)))
        _check_required(output, prompts)
        groups = output["rollserve_group_id"]
        assert groups[0] != groups[1] == groups[2]
        assert [client.group(g).n for g in (groups[0], groups[1])] == [1, 2]
        assert output["rollserve_reward"] == [1.0, 0.0, 0.0]
        # a slice TRL's sampler cannot have made is refused before anything is submitted
        with pytest.raises(TaskPromptError, match="should be one group"):
            func([task_prompt(TWO), task_prompt(THREE)], Trainer())
        # eval mode: num_generations_eval (1) samples per prompt
        output = func(prompts[1:], Trainer(model=Module(training=False)))
        assert len(set(output["rollserve_group_id"])) == 2


def test_prompts_that_are_not_tasks_are_refused_by_name():
    with pytest.raises(TaskPromptError, match="not a rollserve task"):
        rollout_func("http://127.0.0.1:9", timeout=1)(["What is 2 + 2?"] * 2, Trainer())
    with pytest.raises(TaskPromptError, match="instance"):
        task_prompt({"data_source": "math", "instance": "[1, 2]"})
    with pytest.raises(TaskPromptError, match="sampling"):
        task_prompt({**TWO, "sampling": {"temprature": 0.5}})
    # a row's id never becomes the task's id (that would hand back the old group's samples)
    assert '"id"' not in task_prompt({**TWO, "id": "row-1"})
    forged = '{"rollserve_task": {"data_source": "math", "id": "old", "instance": {}}}'
    with pytest.raises(TaskPromptError, match="id"):
        rollout_func("http://127.0.0.1:9", timeout=1)([forged] * 2, Trainer())
    assert task_prompt(TWO) == task_prompt(dict(reversed(list(TWO.items()))))

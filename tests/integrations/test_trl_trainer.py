"""A real TRL GRPOTrainer (a tiny random model, CPU) trained for two steps on rollouts
done by a live rollserve through rollserve.integrations.trl. Skipped without trl."""

import asyncio
import itertools
import math

import pytest

from rollserve.client import Client
from rollserve.contract import SamplingParams
from rollserve.integrations.trl import rollout_func, rollserve_reward, task_prompt

pytest.importorskip("trl", reason="trl is not installed (pip install trl==1.16.0 torch)")

# Every row has every column: Dataset.from_list takes its columns from the first row.
TWO = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "timeouts": {"run": 300}}
# Its second turn never comes back: the rollout times out and is masked.
STUCK = {"data_source": "math", "instance": {"question": "What is 1 + 2?", "answer": "3"}, "timeouts": {"run": 3}}


ANSWERS = itertools.cycle(["4", "5"])  # one sample of each group right, one wrong


async def reply(prompt_ids: list[int], text: str) -> str:
    if "four" not in text:
        return "I think it is four."
    if "1 + 2" in text:
        await asyncio.sleep(120)  # sleep-ok: a double's reply that never comes in time
    return f"So the answer is \\boxed{{{next(ANSWERS)}}}."


def tiny_llama(vocab_size: int):
    """A one-layer random Llama over SmolLM2's vocabulary: seconds to train on CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
        )
    )


def grpo_config(tmp_path):
    """Two optimizer steps, groups of 2, 4 completions a step, on CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        shuffle_dataset=False,
        seed=0,
    )


def test_grpo_trainer_trains_on_rollserve_rollouts(server_factory, fake_llm_thread, tmp_path, monkeypatch):
    import torch
    from trl import GRPOTrainer

    from datasets import Dataset
    from rollserve.llm.tokens.tokenizer import load_tokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    fake = fake_llm_thread(replies=reply)
    server = server_factory("--backend", fake.url).start(timeout=180)
    tokenizer = load_tokenizer("smollm2").hf
    torch.manual_seed(0)
    model = tiny_llama(len(tokenizer))
    dataset = Dataset.from_list([TWO, STUCK]).map(lambda row: {"prompt": task_prompt(row)})
    args = grpo_config(tmp_path)
    with Client(server.url) as client:
        trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            reward_funcs=[rollserve_reward],
            rollout_func=rollout_func(client, sampling=SamplingParams(max_tokens=32), timeout=300),
        )
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        assert math.isfinite(entry["loss"])
        # each step: TWO's two samples (rewards 1 and 0) and STUCK's two masked ones; the
        # masked ones are left out of the reward statistics (as zeros the mean were 0.25)
        assert entry["reward"] == pytest.approx(0.5)
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())


# Every answer to 2 + 2 is right (a zero-variance group: filtered); answers to 3 + 3
# alternate right and wrong. Each batch, the first two calls per question answer at
# once and every later one (the group's over-sampled third) would take 300 s.
SAME = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "timeouts": {"run": 300}}
MIXED = {"data_source": "math", "instance": {"question": "What is 3 + 3?", "answer": "6"}, "timeouts": {"run": 300}}


def test_grpo_trainer_with_oversampling_and_the_zero_variance_filter(
    server_factory, fake_llm_thread, tmp_path, monkeypatch
):
    import torch
    from trl import GRPOTrainer

    from datasets import Dataset
    from rollserve.integrations.groups import BatchCounts
    from rollserve.llm.tokens.tokenizer import load_tokenizer

    calls: dict[str, int] = {"2 + 2": 0, "3 + 3": 0}

    async def reply(prompt_ids: list[int], text: str) -> str:
        question = "2 + 2" if "2 + 2" in text else "3 + 3"
        k = calls[question]
        calls[question] += 1
        if k >= 2:
            await asyncio.sleep(300)
        if question == "2 + 2":
            return "It is \\boxed{4}."
        return "It is \\boxed{6}." if k == 0 else "It is \\boxed{7}."

    batches: list[BatchCounts] = []

    def on_batch(counts: BatchCounts) -> None:
        batches.append(counts)
        calls.update({key: 0 for key in calls})  # the next batch starts afresh

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    fake = fake_llm_thread(replies=reply)
    server = server_factory("--backend", fake.url).start(timeout=180)
    tokenizer = load_tokenizer("smollm2").hf
    torch.manual_seed(0)
    model = tiny_llama(len(tokenizer))
    dataset = Dataset.from_list([SAME, MIXED]).map(lambda row: {"prompt": task_prompt(row)})
    args = grpo_config(tmp_path)
    with Client(server.url) as client:
        func = rollout_func(
            client,
            sampling=SamplingParams(max_tokens=32),
            timeout=240,
            oversample=1,
            filter_zero_variance=True,
            on_batch=on_batch,
        )
        trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            reward_funcs=[rollserve_reward],
            rollout_func=func,
        )
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        trainer.train()
    assert len(batches) == 2
    for counts in batches:
        # each batch: two groups of n=2, each started 3, its third cancelled; the 2 + 2
        # group filtered (its two rows masked), the 3 + 3 group trained
        assert (counts.groups, counts.started, counts.used, counts.cancelled) == (2, 6, 4, 2)
        assert (counts.groups_filtered, counts.groups_usable, counts.filtered) == (1, 1, 2)
        assert (counts.rows, counts.rows_trained) == (4, 2)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        assert math.isfinite(entry["loss"])
        # the filtered rows (rewards 1, 1) are left out: with them the mean were 0.75
        assert entry["reward"] == pytest.approx(0.5)
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())

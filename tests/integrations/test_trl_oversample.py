"""Over-sampling with early stop and DAPO's zero-variance filter through the TRL adapter,
against a live ``rollserve serve`` and a scripted fake vLLM: which samples become TRL's
rows, which rows are masked and why, and the counts the trainer sees (started, used,
cancelled, filtered)."""

import asyncio
import itertools

from rollserve.client import Client
from rollserve.contract import SamplingParams, TaskRequest
from rollserve.integrations.groups import BatchCounts, run_groups
from rollserve.integrations.tensors import to_sample
from rollserve.integrations.trl import rollout_func, rollserve_reward, task_prompt
from rollserve.testing import FakeVLLM
from tests.integrations.test_trl_rollout import EOS, TWO, Trainer, _check_required, _stored

SLOW = 300.0  # seconds a slow sample would take: far past every wait below
MIXED = {"data_source": "math", "instance": {"question": "What is 3 + 3?", "answer": "6"}}
SAMPLING = SamplingParams(max_tokens=64)


def _start(server_factory, fake: FakeVLLM) -> str:
    return server_factory("--backend", fake.url).start(timeout=180).url


def test_oversampling_stops_early_and_trains_the_used_samples(server_factory, fake_llm_thread):
    """n=2 of 4 started: the first two answers (one wrong, one right) come back at once,
    the other two would take 300 s. The extras are cancelled, the rows are the two used
    samples, and the counts say so."""
    calls = itertools.count()

    async def reply(prompt_ids: list[int], text: str) -> str:
        k = next(calls)
        if k >= 2:
            await asyncio.sleep(SLOW)
        return "It is \\boxed{5}." if k == 0 else "It is \\boxed{4}."

    url = _start(server_factory, fake_llm_thread(replies=reply))
    prompts = [task_prompt(TWO)] * 2
    seen: list[BatchCounts] = []
    with Client(url) as client:
        func = rollout_func(client, sampling=SAMPLING, timeout=120, oversample=2, on_batch=seen.append)
        output = func(prompts, Trainer())
        _check_required(output, prompts)
        view = client.group(output["rollserve_group_id"][0])
        assert view.done and view.usable and (view.n, view.oversample) == (2, 2)
        # the rows are the group's used samples, in sample order
        assert output["rollserve_id"] == [m.id for m in view.rollouts if m.used]
        assert sorted(output["rollserve_reward"]) == [0.0, 1.0]
        comps = output["rollserve_reward_components"]
        assert [c["correctness"] for c in comps] == output["rollserve_reward"]
        assert output["rollserve_masked"] == [False, False]
        assert all(sum(mask) > 0 for mask in output["env_mask"])
        cancelled = [m for m in view.rollouts if m.status == "cancelled"]
        assert len(cancelled) == 2
        for member in cancelled:
            assert member.result is not None and member.result.mask and not member.used
            assert member.id not in output["rollserve_id"]
    counts = func.last_counts
    assert counts is not None and seen == [counts]
    assert (counts.groups, counts.groups_usable, counts.groups_masked) == (1, 1, 0)
    assert (counts.started, counts.used, counts.cancelled) == (4, 2, 2)
    assert (counts.rows, counts.rows_trained, counts.filtered) == (2, 2, 0)
    for info in output["rollserve_info"]:
        assert info["used"] is True
        assert info["group"]["reasons"] == [] and info["group"]["masked_whole"] is None
        assert info["group"]["counts"]["cancelled"] == 2


def test_zero_variance_groups_come_back_masked_and_mixed_ones_train(server_factory, fake_llm_thread):
    """filter_zero_variance on: a group answered right twice is filtered (its rows
    masked, reason in the info, nothing deleted on the server); a group with one right
    and one wrong trains; a row that turns the filter off trains even when its rewards
    agree."""
    spread = itertools.count()

    def reply(prompt_ids: list[int], text: str) -> str:
        if "3 + 3" in text:
            return "It is \\boxed{6}." if next(spread) % 2 == 0 else "It is \\boxed{7}."
        return "It is \\boxed{4}."

    url = _start(server_factory, fake_llm_thread(replies=reply))
    prompts = (
        [task_prompt(TWO)] * 2 + [task_prompt(MIXED)] * 2 + [task_prompt({**TWO, "filter_zero_variance": False})] * 2
    )
    with Client(url) as client:
        func = rollout_func(client, sampling=SAMPLING, timeout=120, filter_zero_variance=True)
        output = func(prompts, Trainer())
        _check_required(output, prompts)
        assert output["rollserve_masked"] == [True, True, False, False, False, False]
        rewards = rollserve_reward(prompts, [None] * 6, **output)
        assert rewards[:2] == [None, None] and rewards[4:] == [1.0, 1.0]
        assert sorted(r for r in rewards[2:4] if r is not None) == [0.0, 1.0]
        for i in (0, 1):
            info = output["rollserve_info"][i]
            assert output["env_mask"][i] == [0] * len(output["completion_ids"][i])
            assert info["group"]["reasons"] == ["zero_variance"]
            assert info["group"]["masked_whole"] == "zero_variance"
            assert info["mask_reason"] == "group not usable: zero_variance"
            assert info["used"] is True and info["status"] == "completed"
            # the server keeps the sample as it was: only the trainer's row is masked
            stored = _stored(client, output["rollserve_id"][i])
            assert not stored.mask and stored.reward == 1.0
        for i in (2, 3, 4, 5):
            assert sum(output["env_mask"][i]) > 0
        override = client.group(output["rollserve_group_id"][4])
        assert not override.filter_zero_variance and override.usable
    counts = func.last_counts
    assert counts is not None
    assert (counts.groups, counts.groups_usable, counts.groups_filtered) == (3, 2, 1)
    assert (counts.groups_masked, counts.filtered, counts.cancelled) == (1, 2, 0)
    assert (counts.started, counts.used, counts.rows, counts.rows_trained) == (6, 6, 6, 4)


def test_a_group_short_of_usable_samples(server_factory, fake_llm_thread):
    """Over-sampling n=2 with one extra, two samples masked (a 400 from the server): one
    usable of the two wanted, so every row of the group is masked, the used one and the
    first other sample in sample order. Without over-sampling a masked sample is masked
    on its own and its group's usable one trains."""
    fake = fake_llm_thread(replies=["It is \\boxed{4}."])
    url = _start(server_factory, fake)
    prompts = [task_prompt(TWO)] * 2
    with Client(url) as client:
        fake.fail_next(2, status=400)
        func = rollout_func(client, sampling=SAMPLING, timeout=120, oversample=1)
        output = func(prompts, Trainer())
        _check_required(output, prompts)
        view = client.group(output["rollserve_group_id"][0])
        assert view.done and view.reasons == ["too_few_usable"] and view.counts.used == 1
        (used,) = [m.id for m in view.rollouts if m.used]
        first_other = next(m.id for m in view.rollouts if not m.used)
        assert output["rollserve_id"] == [m.id for m in view.rollouts if m.id in (used, first_other)]
        assert output["rollserve_masked"] == [True, True]
        assert output["rollserve_reward"] == [None, None]
        assert all(sum(mask) == 0 for mask in output["env_mask"])
        for rollout_id, info in zip(output["rollserve_id"], output["rollserve_info"], strict=True):
            assert info["group"]["masked_whole"] == "too_few_usable"
            if rollout_id == used:  # its own result is fine: the group masks it
                assert info["used"] is True
                assert info["mask_reason"] == "group not usable: too_few_usable"
            else:  # masked by the infrastructure failure: that reason is kept
                assert info["used"] is False and info["mask"] is True
                assert not str(info["mask_reason"]).startswith("group not usable")
        counts = func.last_counts
        assert counts is not None
        assert (counts.groups_too_few_usable, counts.groups_masked) == (1, 1)
        assert (counts.started, counts.usable, counts.masked) == (3, 1, 2)
        assert (counts.rows, counts.rows_trained) == (2, 0)

        fake.fail_next(1, status=400)
        plain = rollout_func(client, sampling=SAMPLING, timeout=120)
        output = plain(prompts, Trainer())
        assert sorted(output["rollserve_masked"]) == [False, True]
        assert sorted(output["rollserve_reward"], key=lambda r: r is None) == [1.0, None]
        counts = plain.last_counts
        assert counts is not None
        assert (counts.groups_too_few_usable, counts.groups_masked) == (1, 0)
        assert (counts.rows, counts.rows_trained) == (2, 1)


def test_run_groups_gives_the_used_samples_and_masks_the_rest(server_factory, fake_llm_thread):
    """run_groups (what another adapter may call) keeps its signature and answer: each
    task's n results in sample order; with over-sampling the used ones, and a filtered
    group's results come back masked (a trainer that only reads ``mask`` skips them)."""
    calls = {"2 + 2": itertools.count(), "3 + 3": itertools.count()}

    async def reply(prompt_ids: list[int], text: str) -> str:
        question = "2 + 2" if "2 + 2" in text else "3 + 3"
        if next(calls[question]) >= 2:  # each group's third sample
            await asyncio.sleep(SLOW)
        return "It is \\boxed{4}." if question == "2 + 2" else "It is \\boxed{6}."

    url = _start(server_factory, fake_llm_thread(replies=reply))
    with Client(url) as client:
        filtered, kept = run_groups(
            client,
            [TaskRequest(**TWO, n=2, oversample=1, filter_zero_variance=True), TaskRequest(**MIXED, n=2, oversample=1)],
            timeout=120,
        )
        for results, group_masked in ((filtered, True), (kept, False)):
            assert len(results) == 2
            assert [r.sample_index for r in results] == sorted(r.sample_index for r in results)
            view = client.group(results[0].group_id)
            assert {r.id for r in results} == {m.id for m in view.rollouts if m.used}
            assert all(r.mask is group_masked for r in results)
            assert all(to_sample(r, EOS).masked is group_masked for r in results)

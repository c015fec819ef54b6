"""The quickstart's closing table, from results built here: one row per data_source;
masked rollouts counted, never scored; passes are full rewards; each sample counted
under its bundled task (the quickstart submits samples as tasks of their own)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rollserve.commands.quickstart_summary import graded, print_summary, summarize
from rollserve.contract import (
    Fidelity,
    RolloutResult,
    Stats,
    Timing,
    Tokens,
    Trajectory,
    Turn,
)


def result(
    source: str, task: str, sample: int, reward: float | None, mask: bool = False, ended_by: str | None = "finished"
) -> RolloutResult:
    turns = [
        Turn(
            prompt_ids_delta=[1, 2],
            output_ids=[10, 11],
            logprobs=[-0.5, -0.25],
            finish_reason="stop",
            backend="embedded",
        )
    ]
    tokens = Tokens(input_ids=[1, 2, 10, 11], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -0.25])
    trajectory = Trajectory(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        turns=turns,
        tokens=tokens,
        fidelity=Fidelity(),
        policy_versions=[],
        trainable=True,
        ended_by=ended_by,
        tools=None,
    )
    name = f"{source}-set"
    return RolloutResult(
        id=f"{task}/{sample}",
        group_id=f"g-{task}/{sample}",
        task_id=f"{name}/{task}/{sample}@t",
        data_source=source,
        sample_index=0,
        status="timed_out" if mask else "completed",
        reward=None if mask else reward,
        evaluation=None,
        failure=None,
        mask=mask,
        mask_reason="run timed out" if mask else None,
        stale=False,
        trajectory=trajectory,
        timing=Timing(init=0.5, run=2.0, eval=0.25, total=3.0),
        stats=Stats(turns=1, prompt_tokens=2, output_tokens=2, truncated_turns=0),
        attempt=1,
        metadata={"set": name, "task": task, "sample": sample, "seed": 0},
    )


RESULTS = [
    result("stem", "sum-1", 0, 1.0),
    result("stem", "sum-1", 1, 0.0, ended_by="max_turns"),
    result("stem", "fly", 0, 1.0),
    result("stem", "fly", 1, None, mask=True, ended_by=None),
    result("math", "add", 0, 0.0),
    result("math", "add", 1, 0.0),
]


def test_one_row_per_data_source_masked_counted_not_scored():
    math_, stem = summarize(RESULTS)
    assert (stem.data_source, stem.rollouts, stem.masked, stem.scored, stem.passed) == ("stem", 4, 1, 3, 2)
    assert stem.mean_reward is not None and abs(stem.mean_reward - 2 / 3) < 1e-9
    assert stem.pass_rate == "2/3" and stem.answered == 2  # not the one cut by max_turns, nor the timed-out one
    assert (math_.data_source, math_.rollouts, math_.scored, math_.passed, math_.mean_reward) == ("math", 2, 2, 0, 0.0)


def test_samples_count_under_their_bundled_task():
    grades = [graded(r) for r in RESULTS[:2]]
    assert [(g.task_id, g.sample_index) for g in grades] == [("stem-set/sum-1", 0), ("stem-set/sum-1", 1)]


def printed(results: list[RolloutResult], width: int) -> tuple[str, dict[str, list[str]]]:
    out = io.StringIO()
    print_summary(results, elapsed=2.0, console=Console(file=out, width=width))
    text = out.getvalue()
    rows = {
        line.split()[0]: line.split()
        for line in text.splitlines()
        if line.split() and line.split()[0] in {r.data_source for r in results}
    }
    return text, rows


@pytest.mark.parametrize("width", [80, 200])
def test_the_printed_table(width):
    text, rows = printed(RESULTS, width)
    assert rows["stem"][:5] == ["stem", "4", "1", "0.667", "2/3"]
    assert rows["math"][:5] == ["math", "2", "0", "0.000", "0/2"]
    assert "12 tokens sampled" in text and "No rollout earned" not in text


def test_the_table_reads_whole_at_80_columns():
    slow = [result("code", "x", 0, 1.0)]
    slow[0].timing.run, slow[0].timing.init = 1234.5, 12.5  # wide values
    text, rows = printed(RESULTS + slow, 80)
    lines = text.splitlines()
    table = "\n".join(lines[: next(i for i, line in enumerate(lines) if " rollouts in " in line)])
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert "…" not in table  # no header or value cut short
    header = " ".join(line for line in table.splitlines()[:4])
    for word in (
        "source",
        "rollouts",
        "masked",
        "mean",
        "reward",
        "passed",
        "answered",
        "turns",
        "init",
        "run",
        "eval",
    ):
        assert f" {word} " in f" {header} ", table
    assert rows["code"] == ["code", "1", "0", "1.000", "1/1", "1/1", "1.0", "12.50", "1234.50", "0.25"]

"""The quickstart's closing table: one row per data_source (the handler that ran the
rollouts) with its rollouts, how many were masked, the mean reward over the scored
ones, how many passed (full reward), how many answered in the asked format, and the
mean seconds per stage. Scored, passed and the mean are ``rollserve run``'s evaluation
report's (``client.evaluation``), with each sample counted under its bundled task."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

from rollserve.client.evaluation import Graded, evaluate
from rollserve.contract import RolloutResult


@dataclass(frozen=True)
class SourceSummary:
    """What the table shows of one data_source's rollouts."""

    data_source: str
    rollouts: int
    masked: int  # not scored: an infrastructure failure or a timeout
    scored: int  # rollouts with a reward that are not masked
    mean_reward: float | None  # over the scored ones; None when none was scored
    passed: int  # scored with full reward (1.0)
    answered: int  # the episode ended with an answer in the asked format (code: submitted)
    mean_turns: float
    init_s: float
    run_s: float
    eval_s: float

    @property
    def pass_rate(self) -> str:
        return f"{self.passed}/{self.scored}"


def graded(result: RolloutResult) -> Graded:
    """The result as the evaluation report grades it, under its bundled task: the
    quickstart submits each sample as a task of its own (with its own seed), and says
    in ``metadata`` which bundled row (``set``, ``task``) and sample it is."""
    grade = Graded.of(result)
    meta = result.metadata
    name, task, sample = meta.get("set"), meta.get("task"), meta.get("sample")
    if isinstance(name, str) and isinstance(task, str) and isinstance(sample, int):
        return dataclasses.replace(grade, task_id=f"{name}/{task}", sample_index=sample)
    return grade


def summarize(results: list[RolloutResult]) -> list[SourceSummary]:
    """One summary per data_source, in name order."""
    by_source: dict[str, list[RolloutResult]] = {}
    for result in results:
        by_source.setdefault(result.data_source, []).append(result)
    report = {s.data_source: s for s in evaluate([graded(r) for r in results], ks=[1]).sources}
    rows = []
    for source, group in sorted(by_source.items()):
        graded_source = report[source]
        rows.append(
            SourceSummary(
                data_source=source,
                rollouts=graded_source.samples,
                masked=graded_source.masked,
                scored=graded_source.scored,
                mean_reward=graded_source.mean_reward,
                passed=graded_source.passed,
                answered=sum(r.trajectory.ended_by == "finished" for r in group),
                mean_turns=statistics.fmean(r.stats.turns for r in group),
                init_s=statistics.fmean(r.timing.init for r in group),
                run_s=statistics.fmean(r.timing.run for r in group),
                eval_s=statistics.fmean(r.timing.eval for r in group),
            )
        )
    return rows


# The table's columns: no value is ever cut; headers are whole words, two lines at most,
# so the table fits 80 columns (78 wide for the quickstart's data sources).
COLUMNS = ("source", "rollouts", "masked", "mean\nreward", "passed", "answered", "turns", "init", "run", "eval")


def summary_table(rows: list[SourceSummary]) -> Table:
    """The rows as a table that fits an 80-column terminal: no vertical rules, one space
    of padding each side of a column, numbers never wrapped; a data source name too long
    for what is left folds onto more lines."""
    table = Table(
        title="quickstart results by data_source (mean seconds per stage)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    for column in COLUMNS:
        if column == "source":
            table.add_column(column, overflow="fold", min_width=len(column))
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.data_source,
            str(row.rollouts),
            str(row.masked),
            "-" if row.mean_reward is None else f"{row.mean_reward:.3f}",
            row.pass_rate,
            f"{row.answered}/{row.rollouts}",
            f"{row.mean_turns:.1f}",
            f"{row.init_s:.2f}",
            f"{row.run_s:.2f}",
            f"{row.eval_s:.2f}",
        )
    return table


def print_summary(results: list[RolloutResult], elapsed: float, console: Console) -> None:
    rows = summarize(results)
    console.print(summary_table(rows))
    output_tokens = sum(r.stats.output_tokens for r in results)
    console.print(
        f"{len(results)} rollouts in {elapsed:.1f}s · {output_tokens} tokens sampled · "
        f"{output_tokens / max(elapsed, 1e-9):.1f} tokens/s overall"
    )
    if results and not any(row.passed for row in rows):
        console.print(
            "[dim]No rollout earned a reward this time: SmolLM2-135M is a tiny model that "
            "often misses the asked answer format; a real policy (rollserve serve "
            "--backend URL) does better. The trajectories are still exact and "
            "trainable.[/dim]"
        )

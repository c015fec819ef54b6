"""``rollserve report RESULTS.jsonl``, and the evaluation tables ``rollserve run`` prints.

The numbers come from ``rollserve.client.evaluation`` (definitions there and in
docs/datasets.md); this module lays them out: a table per run, the JSON report, the HTML one.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollserve.client.evaluation import EvaluationReport, Graded, SourceReport, evaluate
from rollserve.commands.report_html import render_html
from rollserve.contract import RolloutResult


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _mean_with_interval(source: SourceReport) -> str:
    mean = _number(source.mean_reward)
    ci = source.mean_reward_ci95
    return mean if ci is None else f"{mean} [{ci.low:.3f}, {ci.high:.3f}]"


def summary_table(report: EvaluationReport, rejected: dict[str, int] | None = None) -> Table:
    """One row per data_source: counts, mean reward [95% CI], pass@k, majority@n."""
    rejected = rejected or {}
    table = Table(title=f"results by data_source (pass: reward >= {report.threshold:g})")
    columns = [
        "data_source",
        "tasks",
        "rollouts",
        "masked",
        "failed",
        "mean reward [95% CI]",
        *(f"pass@{k}" for k in report.ks),
    ]
    majority = any(source.majority is not None for source in report.sources)
    if majority:
        columns.append("maj@n")
    if rejected:
        columns.append("rows rejected")
    for column in columns:
        table.add_column(column, justify="left" if column == "data_source" else "right")
    names = sorted({source.data_source for source in report.sources} | set(rejected))
    by_name = {source.data_source: source for source in report.sources}
    for name in names:
        source = by_name.get(name)
        if source is None:
            cells = [escape(name), *("0" for _ in range(4)), "-", *("-" for _ in report.ks)]
        else:
            failed = source.samples - source.statuses.get("completed", 0)
            cells = [
                escape(name),
                str(source.tasks),
                str(source.samples),
                str(source.masked),
                str(failed),
                _mean_with_interval(source),
                *(_number(source.pass_at_k.get(k)) for k in report.ks),
            ]
        if majority:
            cells.append(_number(source.majority) if source else "-")
        if rejected:
            cells.append(str(rejected.get(name, 0)))
        table.add_row(*cells)
    return table


def failures_table(report: EvaluationReport) -> Table | None:
    """Failed and masked results by kind and reason, or None when there are none."""
    rows = [
        (source.data_source, f"failure: {kind}", count)
        for source in report.sources
        for kind, count in source.failures.items()
    ]
    rows += [
        (source.data_source, f"masked: {reason}", count)
        for source in report.sources
        for reason, count in source.mask_reasons.items()
    ]
    if not rows:
        return None
    table = Table(title="failures and masked results")
    for column in ("data_source", "kind", "results"):
        table.add_column(column, justify="right" if column == "results" else "left")
    for name, kind, count in rows:
        table.add_row(escape(name), escape(kind), str(count))
    return table


def components_table(report: EvaluationReport) -> Table | None:
    """Each reward component's mean (and median) per data_source, or None without any."""
    rows = [(source.data_source, name, dist) for source in report.sources for name, dist in source.components.items()]
    if not rows:
        return None
    table = Table(title="reward components (scored samples)")
    for column in ("data_source", "component", "samples", "mean", "p50"):
        table.add_column(column, justify="left" if column in ("data_source", "component") else "right")
    for name, component, dist in rows:
        table.add_row(escape(name), escape(component), str(len(dist.values)), _number(dist.mean), _number(dist.p50))
    return table


def write_reports(report: EvaluationReport, json_path: Path | None, html_path: Path | None, title: str) -> list[Path]:
    """Write the JSON and/or HTML report; returns the paths written."""
    written = []
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
        written.append(json_path)
    if html_path is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(render_html(report, title), encoding="utf-8")
        written.append(html_path)
    return written


def parse_ks(value: str | None) -> list[int] | None:
    """``--k 1,4,8`` as a list (None: the default ks)."""
    if value is None:
        return None
    try:
        ks = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"a comma-separated list of whole numbers, got {value!r}", param_hint="--k") from None
    if not ks or any(k < 1 for k in ks):
        raise typer.BadParameter(f"every k must be at least 1, got {value!r}", param_hint="--k")
    return ks


def read_results(path: Path) -> tuple[list[Graded], int]:
    """The results in a JSONL file (``rollserve run``'s output), and how many lines were
    not results (blank lines aside)."""
    graded: list[Graded] = []
    skipped = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                graded.append(Graded.of(RolloutResult.model_validate(json.loads(line))))
            except (ValueError, ValidationError):
                skipped += 1
    return graded, skipped


K_HELP = "the k of pass@k, comma-separated (default: 1, powers of two, the largest n)"
THRESHOLD_HELP = "a scored sample passes when its reward is at least this"


def report(
    results: Path = typer.Argument(
        ..., exists=True, dir_okay=False, readable=True, help="results JSONL (rollserve run's output)"
    ),
    json_out: Path | None = typer.Option(None, "--json", help="write the report as JSON here"),
    html_out: Path | None = typer.Option(None, "--html", help="write an HTML report (plots, opens offline) here"),
    k: str | None = typer.Option(None, "--k", help=K_HELP),
    threshold: float = typer.Option(1.0, "--pass-threshold", help=THRESHOLD_HELP),
) -> None:
    """Evaluate a results file: per data_source pass@k, majority@n, mean reward [95% CI],
    failures by kind."""
    console, out = Console(stderr=True), Console()
    graded, skipped = read_results(results)
    if not graded:
        console.print(
            f"[red]error:[/red] no rollserve results in {escape(str(results))}"
            f"{f' ({skipped} lines were not results)' if skipped else ''}"
        )
        raise typer.Exit(2)
    if skipped:
        console.print(
            f"[yellow]note:[/yellow] {skipped} lines of {escape(str(results))} are not rollserve results: left out"
        )
    evaluation = evaluate(graded, ks=parse_ks(k), threshold=threshold)
    out.print(summary_table(evaluation))
    for table in (failures_table(evaluation), components_table(evaluation)):
        if table is not None:
            out.print(table)
    for path in write_reports(evaluation, json_out, html_out, title=results.name):
        console.print(f"wrote [bold]{escape(str(path))}[/bold]")

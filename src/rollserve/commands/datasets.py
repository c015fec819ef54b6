"""``rollserve datasets validate FILE``: check every row against its handler, offline;
``rollserve datasets oracle DIR``: run Harbor tasks with their oracle and the empty agent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollserve.commands.options import check_runtime
from rollserve.commands.options import handler_options as parse_handler_options
from rollserve.datasets import BUNDLED, DatasetError, DatasetRow, harbor_root, read_dataset

if TYPE_CHECKING:  # imported where used: the engine side is slow to import for a CLI
    from rollserve.commands.dataset_check import RowCheck

app = typer.Typer(no_args_is_help=True, help="Check dataset files before running them.")

FILE_HELP = (
    "a JSONL (.jsonl, .jsonl.gz) or parquet file, one task per row; a folder of Harbor "
    "tasks (one row per task folder, or the one task a folder with task.toml is: the "
    "harbor family's root is set to it unless --handler-options set one); or a bundled "
    "set: " + ", ".join(BUNDLED)
)
DATA_SOURCE_HELP = (
    "every row is a bare instance of this data source (e.g. a SWE-bench dump); "
    "without it each row is a task {data_source, instance, n?, ...}"
)
AUTO_ROWS = 200  # up to this many rows the table lists every row; past it, the invalid ones


def bundled(file: Path, data_source: str | None) -> tuple[Path, str | None]:
    """A bundled set's file and data source when ``file`` names one (and is no file here)."""
    bundled_set = BUNDLED.get(str(file))
    if bundled_set is None or file.exists():
        return file, data_source
    return bundled_set.path, data_source or bundled_set.data_source


def with_harbor_root(file: Path, options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``options`` with the harbor family's root set to a Harbor dataset folder's root,
    when ``file`` is a folder and the options name no root of their own."""
    if not file.is_dir() or "root" in options.get("harbor", {}):
        return options
    return {**options, "harbor": {**options.get("harbor", {}), "root": str(harbor_root(file))}}


def read_rows(file: Path, data_source: str | None, console: Console) -> list[DatasetRow]:
    """The file's rows (or a bundled set's), or a clear error and exit 2 if it cannot
    be read."""
    file, data_source = bundled(file, data_source)
    try:
        return read_dataset(file, data_source)
    except DatasetError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc


def checks_table(checks: list[RowCheck], title: str | None = None) -> Table:
    table = Table(title=title)
    table.add_column("row", justify="right")
    table.add_column("task id")
    table.add_column("data_source")
    table.add_column("result", overflow="fold")
    for check in checks:
        row = check.row
        verdict = "[green]OK[/green]" if check.error is None else f"[red]{escape(check.error)}[/red]"
        table.add_row(str(row.number), escape(row.label or "-"), escape(row.data_source or "-"), verdict)
    return table


def summary(checks: list[RowCheck]) -> dict[str, Any]:
    by_source: dict[str, Counter[str]] = {}
    for check in checks:
        counts = by_source.setdefault(check.row.data_source or "-", Counter())
        counts["ok" if check.ok else "invalid"] += 1
    return {
        "ok": sum(c.ok for c in checks),
        "invalid": sum(not c.ok for c in checks),
        "by_data_source": {name: {"ok": c["ok"], "invalid": c["invalid"]} for name, c in sorted(by_source.items())},
    }


VALIDATE_HELP = (
    "Check each row of FILE as the API would at submission (no server needed).\n\n"
    "Row numbers are JSONL line numbers (parquet: row numbers, from 1; a folder of "
    "Harbor tasks: its task folders in name order, from 1). Exit code 0 "
    "if every row is valid, 1 if any is not, 2 if the file cannot be read."
)


@app.command(help=VALIDATE_HELP)
def validate(
    file: Path = typer.Argument(..., help=FILE_HELP),
    data_source: str | None = typer.Option(None, "--data-source", "-d", help=DATA_SOURCE_HELP),
    max_errors: int | None = typer.Option(None, min=1, help="stop after this many invalid rows"),
    json_output: bool = typer.Option(False, "--json", help="print the report as JSON (stdout)"),
    rows: str = typer.Option(
        "auto", help=f"rows the table lists: all | errors | auto (every row up to {AUTO_ROWS}, else the invalid ones)"
    ),
    sandbox_runtime: str = typer.Option(
        "bubblewrap", help="the server's runtime (what some handlers accept depends on it)"
    ),
    handler_options: str | None = typer.Option(
        None, help='handlers\' options as JSON, {"handler": {...}}, as the server gets them'
    ),
) -> None:
    """Check each row of FILE as the API would at submission (no server needed)."""
    from rollserve.commands.dataset_check import DatasetChecker, offline_context

    if rows not in ("all", "errors", "auto"):
        raise typer.BadParameter("must be all, errors or auto", param_hint="--rows")
    check_runtime(sandbox_runtime)
    options = with_harbor_root(file, parse_handler_options(handler_options))
    out = Console()
    dataset = read_rows(file, data_source, Console(stderr=True))
    checker = DatasetChecker(context=offline_context(runtime=sandbox_runtime, options=options))
    checks = checker.check_all(dataset, max_errors=max_errors)
    report = summary(checks)
    unchecked = len(dataset) - len(checks)
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "file": str(file),
                    "rows": [
                        {
                            "row": c.row.number,
                            "task_id": c.row.label,
                            "data_source": c.row.data_source,
                            "ok": c.ok,
                            "error": c.error,
                        }
                        for c in checks
                    ],
                    "summary": {**report, "unchecked": unchecked},
                },
                indent=1,
            )
        )
    else:
        listed = (
            checks
            if rows == "all" or (rows == "auto" and len(checks) <= AUTO_ROWS)
            else [c for c in checks if not c.ok]
        )
        if listed:
            out.print(checks_table(listed, title=f"{file}"))
        hidden = len(checks) - len(listed)
        if hidden:
            out.print(f"[dim]{hidden} valid rows not listed (--rows all lists them)[/dim]")
        by_source = ", ".join(
            f"{name}: {c['ok']} ok, {c['invalid']} invalid" for name, c in report["by_data_source"].items()
        )
        colour = "red" if report["invalid"] else "green"
        out.print(f"[{colour}]{report['ok']} ok, {report['invalid']} invalid[/{colour}] ({escape(by_source)})")
        if unchecked:
            out.print(f"stopped after {report['invalid']} invalid rows (--max-errors); {unchecked} rows not checked")
    raise typer.Exit(1 if report["invalid"] else 0)


ORACLE_HELP = (
    "Run every Harbor task in DIR (a task folder, or a folder of them) with its "
    "oracle (solution/solve.sh) and with the empty agent, through a server in this "
    "process, as a rollout runs: a task passes when the oracle scores 1 and the "
    "empty agent 0. Exit code 0 if every task passes, 1 if any fails."
)


@app.command(help=ORACLE_HELP)
def oracle(
    folder: Path = typer.Argument(..., exists=True, file_okay=False, help="a Harbor task folder, or a folder of them"),
    json_output: bool = typer.Option(False, "--json", help="print the report as JSON (stdout)"),
    sandbox_runtime: str = typer.Option("bubblewrap", help="where the tasks run"),
    sandbox_options: str | None = typer.Option(None, help="the runtime's options as JSON"),
    handler_options: str | None = typer.Option(
        None, help='handlers\' options as JSON, {"harbor": {...}}, as the server gets them'
    ),
) -> None:
    import asyncio

    from rollserve.commands.harbor_oracle import check_tasks
    from rollserve.commands.options import sandbox_options as parse_sandbox_options

    check_runtime(sandbox_runtime)
    checks = asyncio.run(
        check_tasks(
            folder,
            sandbox_runtime,
            parse_handler_options(handler_options),
            parse_sandbox_options(sandbox_runtime, sandbox_options),
        )
    )
    failed = [c for c in checks if not c.ok]
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "tasks": [
                        {
                            "task": c.task,
                            "ok": c.ok,
                            "oracle_reward": c.oracle,
                            "empty_agent_reward": c.empty,
                            "problem": c.problem,
                        }
                        for c in checks
                    ],
                    "summary": {"ok": len(checks) - len(failed), "failed": len(failed)},
                },
                indent=1,
            )
        )
    else:
        table = Table(title=f"oracle check: {folder}")
        for column in ("task", "oracle", "empty agent", "result"):
            table.add_column(column, overflow="fold")
        for c in checks:
            verdict = "[green]OK[/green]" if c.ok else f"[red]{escape(c.problem or '')}[/red]"
            table.add_row(escape(c.task), str(c.oracle), str(c.empty), verdict)
        out = Console()
        out.print(table)
        colour = "red" if failed else "green"
        out.print(f"[{colour}]{len(checks) - len(failed)} ok, {len(failed)} failed[/{colour}]")
    raise typer.Exit(1 if failed else 0)

"""``rollserve images pull FILE``: fetch every environment image a dataset needs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollserve.commands.datasets import DATA_SOURCE_HELP, FILE_HELP, read_rows, with_harbor_root
from rollserve.commands.options import handler_options as parse_handler_options

if TYPE_CHECKING:
    from rollserve.sandbox.base import ImageRuntime
    from rollserve.sandbox.images import PullResult

app = typer.Typer(no_args_is_help=True, help="Environment images (containers) of datasets.")


PULL_HELP = (
    "Fetch the images FILE's rows need (each handler's images(instance)), once each.\n\n"
    "Exit code 0 if every image is there (fetched or already cached), 1 if any failed, "
    "2 on a usage error (bad file, runtime not installed)."
)


@app.command(help=PULL_HELP)
def pull(
    file: Path = typer.Argument(..., help=FILE_HELP),
    data_source: str | None = typer.Option(None, "--data-source", "-d", help=DATA_SOURCE_HELP),
    runtime: str = typer.Option(
        "apptainer", help="apptainer | singularity (build .sif files into --image-cache) | docker | podman (pull)"
    ),
    concurrency: int = typer.Option(4, min=1, help="images fetched at once"),
    retries: int = typer.Option(2, min=0, help="retries of a failed image (exponential backoff)"),
    backoff: float = typer.Option(2.0, min=0.0, help="seconds before the first retry (doubling)"),
    timeout: float = typer.Option(3600.0, min=1.0, help="seconds one fetch may take"),
    image_cache: Path | None = typer.Option(
        None,
        help="apptainer: where .sif files go; the server's cache: STATE_DIR/images "
        "(default; STATE_DIR as `rollserve serve --state-dir`) or its "
        "--sandbox-options image_cache",
    ),
    handler_options: str | None = typer.Option(
        None, help='handlers\' options as JSON, {"handler": {...}}, as the server gets them'
    ),
) -> None:
    """Fetch the images FILE's rows need (each handler's images(instance)), once each."""
    from rollserve.sandbox.registry import image_runtimes
    from rollserve.server import default_state_dir

    err, out = Console(stderr=True), Console()
    if runtime not in image_runtimes():
        raise typer.BadParameter(f"must be one of {', '.join(image_runtimes())}", param_hint="--runtime")
    options = with_harbor_root(file, parse_handler_options(handler_options))
    puller = _puller(runtime, image_cache or default_state_dir() / "images", concurrency, timeout, err)
    needed, errors, valid = _images_needed(file, data_source, runtime, options, err)
    references, failures = _references(puller, needed)
    if not references and not failures:
        out.print(f"no images needed: {valid} valid rows, whose handlers list none")
        raise typer.Exit(1 if errors else 0)
    results = _pull_with_progress(references, puller, err, concurrency=concurrency, retries=retries, backoff=backoff)
    failures += [r for r in results if not r.ok]
    _report(out, references, results, failures, puller.image_location())
    raise typer.Exit(1 if failures or errors else 0)


def _puller(runtime: str, cache: Path, concurrency: int, timeout: float, err: Console) -> ImageRuntime[Any]:
    """The runtime's puller; exit 2 naming the other runtimes when its binary is missing."""
    from rollserve.sandbox.images import RuntimeMissing, make_puller
    from rollserve.sandbox.registry import RUNTIMES, image_runtimes

    try:
        return make_puller(runtime, cache, concurrency=concurrency, timeout=timeout)
    except RuntimeMissing as exc:
        others = ", ".join(name for name in image_runtimes() if RUNTIMES[name] is not RUNTIMES[runtime])
        err.print(f"[red]error:[/red] {escape(str(exc))}, or pick another --runtime ({others})")
        raise typer.Exit(2) from None


def _images_needed(
    file: Path, data_source: str | None, runtime: str, options: dict[str, dict[str, Any]], err: Console
) -> tuple[dict[str, list[int]], list[tuple[int, str]], int]:
    """The images FILE's valid rows need (reference -> row numbers), the rows whose images
    could not be listed (number, error), and how many rows are valid; invalid rows are
    skipped with a warning, the errors printed."""
    from rollserve.commands.dataset_check import DatasetChecker, images_needed, offline_context

    rows = read_rows(file, data_source, err)
    checker = DatasetChecker(context=offline_context(runtime=runtime, options=options))
    checks = checker.check_all(rows)
    invalid = [c for c in checks if not c.ok]
    if invalid:
        err.print(
            f"[yellow]warning:[/yellow] {len(invalid)} invalid rows skipped (rows "
            f"{', '.join(str(c.row.number) for c in invalid[:10])}"
            f"{', ...' if len(invalid) > 10 else ''}); `rollserve datasets validate "
            f"{escape(str(file))}` says why"
        )
    needed, errors = images_needed(checker, checks)
    for number, error in errors:
        err.print(f"[red]row {number}:[/red] {escape(error)}")
    return needed, errors, len(checks) - len(invalid)


def _references(puller: ImageRuntime[Any], needed: Iterable[str]) -> tuple[list[str], list[PullResult]]:
    """The runtime's references of the ``needed`` images, once each, and a failed result
    for each image whose name the runtime refuses."""
    from rollserve.sandbox.images import BadImageReference, PullResult

    failures: list[PullResult] = []
    references: list[str] = []
    for reference in needed:
        try:
            references.append(puller.image_reference(reference))
        except BadImageReference as exc:
            failures.append(PullResult(reference, ok=False, error=str(exc)))
    return list(dict.fromkeys(references)), failures


def _pull_with_progress(
    references: list[str], puller: ImageRuntime[Any], err: Console, *, concurrency: int, retries: int, backoff: float
) -> list[PullResult]:
    """Fetch ``references``, a progress bar (fetched, failed, cached) and each retry on ``err``."""
    from rollserve.sandbox.images import pull_images

    columns = (
        TextColumn("images"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed · {task.fields[cached]} cached"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err) as progress:
        bar = progress.add_task("pull", total=len(references), failed=0, cached=0)
        counts = {"failed": 0, "cached": 0}

        def on_result(result: PullResult) -> None:
            counts["failed"] += not result.ok
            counts["cached"] += result.cached
            progress.update(bar, advance=1, failed=counts["failed"], cached=counts["cached"])

        def on_retry(reference: str, attempt: int, error: str) -> None:
            progress.console.print(
                f"[yellow]retrying[/yellow] {escape(reference)} (attempt "
                f"{attempt} failed: {escape(error.splitlines()[0][:200])})"
            )

        return asyncio.run(
            pull_images(
                references,
                puller,
                concurrency=concurrency,
                retries=retries,
                backoff=backoff,
                on_result=on_result,
                on_retry=on_retry,
            )
        )


def _report(
    out: Console, references: list[str], results: list[PullResult], failures: list[PullResult], location: Path | None
) -> None:
    """What was fetched, already there and failed; a table of the failures."""
    fetched = sum(r.ok and not r.cached for r in results)
    cached = sum(r.cached for r in results)
    where = f" into {location}" if location is not None else ""
    out.print(
        f"{len(references)} images{where}: {fetched} fetched, {cached} already there, "
        f"[{'red' if failures else 'green'}]{len(failures)} failed[/]"
    )
    if failures:
        table = Table(title="failed images")
        table.add_column("reference", overflow="fold")
        table.add_column("attempts", justify="right")
        table.add_column("last error", overflow="fold")
        for result in failures:
            table.add_row(escape(result.reference), str(result.attempts), escape((result.error or "").strip()[-500:]))
        out.print(table)

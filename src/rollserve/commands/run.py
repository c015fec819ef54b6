"""``rollserve run FILE``: a dataset through a server (running, or started here),
results to JSONL, with progress and a summary: the evaluation before training."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from rollserve.commands.datasets import (
    DATA_SOURCE_HELP,
    FILE_HELP,
    checks_table,
    read_rows,
    with_harbor_root,
)
from rollserve.commands.defaults import ENGINE, RUN, SERVER
from rollserve.commands.options import check_backends, parse_json_option
from rollserve.commands.options import handler_options as parse_handler_options
from rollserve.commands.options import sandbox_options as parse_sandbox_options
from rollserve.commands.report import (
    K_HELP,
    THRESHOLD_HELP,
    components_table,
    failures_table,
    parse_ks,
    summary_table,
    write_reports,
)
from rollserve.engine.pipeline import EngineConfig
from rollserve.server import ServerConfig
from rollserve.validation import describe

if TYPE_CHECKING:
    from rollserve.client import AsyncClient
    from rollserve.client.run_dataset import RunItem, RunOptions, RunProgress, RunReport
    from rollserve.datasets import DatasetRow


@dataclass(frozen=True)
class _ServerFacts:
    """What row validation may depend on: the server's runtime, handlers' options, and
    (a remote server) the data sources it runs."""

    runtime: str | None = None
    handler_options: dict[str, dict[str, Any]] | None = None
    handlers: tuple[str, ...] = ()


@dataclass(frozen=True)
class _RunArgs:
    """``rollserve run``'s options, checked."""

    output: Path
    runtime: str
    handler_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    sampling: dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    timeouts: dict[str, Any] | None = None
    n: int | None = None
    batch_size: int = RUN.batch_size
    concurrency: int = RUN.max_in_flight
    skip_invalid: bool = False
    resume: bool = False
    run_name: str | None = None
    report: Path | None = None  # the JSON evaluation report (default: OUTPUT.report.json)
    html: Path | None = None
    ks: list[int] | None = None
    threshold: float = 1.0


# Opens a client to the server and says what validation needs to know of it.
ClientFactory = Callable[[], AbstractAsyncContextManager[tuple["AsyncClient", _ServerFacts]]]


def _checked(model: type[BaseModel], values: dict[str, Any], hint: str) -> dict[str, Any]:
    try:
        model(**values)
    except ValidationError as exc:
        raise typer.BadParameter(describe(exc), param_hint=hint) from None
    return values


def _embedded_config(
    state_dir: Path,
    backend: list[str],
    tokenizer: str,
    sandbox_runtime: str,
    sandbox_options: dict[str, Any],
    workers: tuple[int, int, int],
    scoring_workers: int,
    max_pending: int,
    handler_options: dict[str, dict[str, Any]] | None = None,
) -> ServerConfig:
    """The embedded server's config (its options already checked as ``serve`` checks them)."""
    check_backends(backend)
    init, run, eval_ = workers
    return ServerConfig(
        state_dir=state_dir,
        backends=backend,
        tokenizer=tokenizer,
        sandbox_runtime=sandbox_runtime,
        sandbox_options=sandbox_options,
        handler_options=handler_options or {},
        scoring_workers=scoring_workers,
        engine=EngineConfig(
            init_workers=init, run_workers=run, eval_workers=eval_, max_pending=max(ENGINE.max_pending, max_pending)
        ),
    )


@asynccontextmanager
async def _embedded(config: ServerConfig, console: Console) -> AsyncIterator[AsyncClient]:
    """A server in this process, and a client talking to it without a port."""
    import httpx

    from rollserve.api.app import create_app
    from rollserve.client import AsyncClient
    from rollserve.engine.weights_file import WeightsFileError
    from rollserve.llm.tokens import TokenizerError
    from rollserve.server import Service

    try:
        with console.status(f"starting the embedded server ({', '.join(config.backends)})…"):
            service = Service(config)
            await service.start()
    except (TokenizerError, WeightsFileError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    app = create_app(service, manage_lifecycle=False)
    client = AsyncClient("http://rollserve", transport=httpx.ASGITransport(app=app), timeout=60)
    try:
        yield client
    finally:
        await client.aclose()
        await service.stop()


def _valid_rows(
    rows: list[DatasetRow], server: _ServerFacts, skip_invalid: bool, console: Console, out: Console
) -> list[DatasetRow] | None:
    """The rows to run, or None (after saying why) if invalid rows forbid starting."""
    from rollserve.commands.dataset_check import DatasetChecker, offline_context

    context = offline_context(runtime=server.runtime or SERVER.sandbox_runtime, options=server.handler_options)
    checks = DatasetChecker(context=context, remote_handlers=server.handlers).check_all(rows)
    invalid = [c for c in checks if not c.ok]
    if invalid and not skip_invalid:
        out.print(checks_table(invalid, title="invalid rows"))
        console.print(
            f"[red]error:[/red] {len(invalid)} invalid rows (rows "
            f"{', '.join(str(c.row.number) for c in invalid[:20])}"
            f"{', ...' if len(invalid) > 20 else ''}); fix them or pass "
            "--skip-invalid. Nothing was submitted."
        )
        return None
    if invalid:
        console.print(f"[yellow]skipping {len(invalid)} invalid rows[/yellow]")
    return [c.row for c in checks if c.ok]


async def _run(
    rows: list[DatasetRow],
    file: Path,
    opts: _RunArgs,
    client_factory: ClientFactory,
    remote: bool,
    console: Console,
    out: Console,
) -> int:
    from rollserve.client.run_dataset import RunOptions, plan
    from rollserve.datasets import dataset_name

    valid = None
    if not remote:  # checked before the embedded server loads its model
        valid = _valid_rows(
            rows,
            _ServerFacts(runtime=opts.runtime, handler_options=opts.handler_options),
            opts.skip_invalid,
            console,
            out,
        )
        if valid is None:
            return 2
    async with client_factory() as (client, server):
        if valid is None:  # checked knowing the remote server's handlers and runtime
            if file.is_dir():  # Harbor tasks: checked here in FILE, run there in the server's root
                server = replace(server, handler_options=with_harbor_root(file, {}))
            valid = _valid_rows(rows, server, opts.skip_invalid, console, out)
            if valid is None:
                return 2
        options = RunOptions(
            sampling=opts.sampling,
            agent=opts.agent,
            timeouts=opts.timeouts,
            batch_size=opts.batch_size,
            max_in_flight=opts.concurrency,
        )
        try:
            items = plan(valid, opts.run_name or dataset_name(file), options, n=opts.n)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            return 2
        report = await _run_with_progress(client, items, options, opts, console)
    if report is None:
        return 1
    return _print_report(report, opts, console, out)


async def _run_with_progress(
    client: AsyncClient, items: list[RunItem], options: RunOptions, opts: _RunArgs, console: Console
) -> RunReport | None:
    """The run's report, a progress bar on ``console`` as it goes; None (printed why)
    when the run stopped."""
    from rollserve.client.run_dataset import DatasetRun, RunAborted

    columns = (
        TextColumn("rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("run", total=None, info="")

        def on_change(p: RunProgress) -> None:
            mean = "-" if p.mean_reward is None else f"{p.mean_reward:.3f}"
            bar.update(
                task,
                total=p.total,
                completed=p.finished,
                info=f"submitted {p.submitted} · failed {p.failed} · mean reward {mean}",
            )

        run = DatasetRun(client, items, opts.output, options, resume=opts.resume, on_change=on_change)
        try:
            return await run.run()
        except RunAborted as exc:
            console.print(
                f"[red]error:[/red] {escape(str(exc))}; what finished is in "
                f"{escape(str(opts.output))} (rerun with --resume to go on)"
            )
            return None


def _print_report(report: RunReport, opts: _RunArgs, console: Console, out: Console) -> int:
    """What the run did (resumed, reused, foreign lines), its evaluation and reports, the
    rejected rows; the exit code: 1 if the server rejected some rows, else 0."""
    progress = report.progress
    if progress.skipped_rows:
        console.print(
            f"resumed: {progress.skipped_rows} of {progress.rows} rows were already in {escape(str(opts.output))}"
        )
    if progress.reused_groups:
        console.print(
            f"{progress.reused_groups} tasks were already on the server (same rows and "
            "settings): their results were reused, not rerun (--run-name NAME runs "
            "them again)"
        )
    if report.foreign_results:
        console.print(
            f"[yellow]note:[/yellow] {report.foreign_results} results in "
            f"{escape(str(opts.output))} are not rows of this run (other settings or data)"
        )
    evaluation = report.evaluation(ks=opts.ks, threshold=opts.threshold)
    out.print(summary_table(evaluation, report.rejected_by_data_source()))
    for table in (failures_table(evaluation), components_table(evaluation)):
        if table is not None:
            out.print(table)
    json_path = opts.report or opts.output.with_suffix(".report.json")
    for path in write_reports(evaluation, json_path, opts.html, title=opts.output.name):
        console.print(f"wrote the evaluation report to [bold]{escape(str(path))}[/bold]")
    for item in report.rejected:
        console.print(f"[red]row {item.number} rejected:[/red] {escape(item.error or '')}")
    console.print(
        f"wrote {progress.finished} results to [bold]{escape(str(opts.output))}[/bold] ({len(report.outcomes)} in all)"
    )
    return 1 if report.rejected else 0


HELP = (
    "Run every row of FILE and write each rollout's result to OUTPUT (JSONL).\n\n"
    "FILE may be a folder of Harbor tasks: its rows name each task by its folder's name "
    "(relative to FILE; a task folder itself: to its parent). The embedded server's harbor "
    "root is that folder unless --handler-options set one; with --server, that server's "
    "harbor root must hold the same tasks under the same names (`rollserve serve "
    '--handler-options \'{"harbor": {"root": DIR}}\'`): the rows are checked here '
    "against FILE.\n\n"
    "Rows are submitted under ids derived from the file, row and settings, so running again "
    "against the same server reuses what it already did. Exit code 0 when every row has its "
    "results, 1 if the server refused some rows or the run stopped, 2 on a usage error or "
    "invalid rows."
)


def run(
    file: Path = typer.Argument(..., help=FILE_HELP),
    data_source: str | None = typer.Option(None, "--data-source", "-d", help=DATA_SOURCE_HELP),
    output: Path = typer.Option(
        Path("results.jsonl"), "--output", "-o", help="results, one JSON per line (rewritten unless --resume)"
    ),
    resume: bool = typer.Option(False, help="keep OUTPUT's results and fetch only the rest"),
    report: Path | None = typer.Option(
        None, help="the evaluation report as JSON (default: OUTPUT with suffix .report.json)"
    ),
    html: Path | None = typer.Option(None, help="also an HTML report with plots (opens offline)"),
    k: str | None = typer.Option(None, "--k", help=K_HELP),
    pass_threshold: float = typer.Option(1.0, help=THRESHOLD_HELP),
    run_name: str | None = typer.Option(
        None,
        help="the rows' ids start with it (default: the "
        "file's name); a new name runs the rows "
        "again on a server that has them",
    ),
    n: int | None = typer.Option(None, min=1, max=1024, help="samples per row (default: the row's n, else 1)"),
    max_turns: int | None = typer.Option(None, min=1, help="agent turns per episode"),
    max_tokens: int | None = typer.Option(None, min=1, help="new tokens per turn"),
    temperature: float | None = typer.Option(None, min=0.0),
    sampling: str | None = typer.Option(
        None, help='more sampling settings as JSON, e.g. \'{"top_p": 0.95, "seed": 1}\''
    ),
    rollout_timeout: float | None = typer.Option(None, min=1.0, help="seconds per rollout (default: the handler's)"),
    batch_size: int = typer.Option(RUN.batch_size, min=1, max=10_000, help="tasks per submission"),
    concurrency: int = typer.Option(RUN.max_in_flight, min=1, help="rollouts submitted and unfinished at once"),
    skip_invalid: bool = typer.Option(
        False, help="run the valid rows when some are invalid (default: refuse to start)"
    ),
    server: str | None = typer.Option(
        None,
        envvar="ROLLSERVE_URL",
        help="a running rollserve, e.g. http://head:8000 (else one is started here with --backend)",
    ),
    api_token: str | None = typer.Option(None, envvar="ROLLSERVE_API_TOKEN", help="--server's bearer token"),
    backend: list[str] = typer.Option(
        list(SERVER.backends),
        "--backend",
        "-b",
        help="embedded server: inference backend, as `rollserve serve --backend`; repeatable",
    ),
    tokenizer: str = typer.Option(SERVER.tokenizer, help="embedded server: as `rollserve serve`"),
    sandbox_runtime: str = typer.Option(SERVER.sandbox_runtime, help="embedded server: as `rollserve serve`"),
    sandbox_options: str | None = typer.Option(None, help="embedded server: the runtime's options as JSON"),
    handler_options: str | None = typer.Option(
        None, help='embedded server: handlers\' options as JSON, e.g. \'{"swe": {"empty_patch": "run"}}\''
    ),
    state_dir: Path | None = typer.Option(
        None, help="embedded server: its store (default: a temporary folder, removed after)"
    ),
    init_workers: int = typer.Option(ENGINE.init_workers, min=1, help="embedded server: concurrent INIT stages"),
    run_workers: int = typer.Option(ENGINE.run_workers, min=1, help="embedded server: concurrent agent loops"),
    eval_workers: int = typer.Option(ENGINE.eval_workers, min=1, help="embedded server: concurrent EVAL stages"),
    scoring_workers: int = typer.Option(SERVER.scoring_workers, min=1, help="embedded server: scoring processes"),
) -> None:
    """Run every row of FILE and write each rollout's result to OUTPUT (JSONL)."""
    from rollserve.contract import AgentLimits, SamplingParams, Timeouts

    console, out = Console(stderr=True), Console()
    if server and backend:
        raise typer.BadParameter(
            "--backend starts a server here; with --server, register backends on that server", param_hint="--backend"
        )
    if not server and not backend:
        raise typer.BadParameter(
            "give --server URL (a running rollserve) or --backend URL|embedded (start one in this process)",
            param_hint="--server",
        )
    sampling_values = parse_json_option(sampling, "--sampling")
    sampling_values.update(
        {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature)) if v is not None}
    )
    opts = _RunArgs(
        sampling=_checked(SamplingParams, sampling_values, "--sampling") or None,
        agent={"max_turns": max_turns} if max_turns else None,
        timeouts=_checked(Timeouts, {"total": rollout_timeout} if rollout_timeout else {}, "--rollout-timeout") or None,
        n=n,
        batch_size=batch_size,
        concurrency=concurrency,
        skip_invalid=skip_invalid,
        output=output,
        resume=resume,
        runtime=sandbox_runtime,
        run_name=run_name,
        report=report,
        html=html,
        ks=parse_ks(k),
        threshold=pass_threshold,
        handler_options=with_harbor_root(file, parse_handler_options(handler_options)),
    )
    _checked(AgentLimits, opts.agent or {}, "--max-turns")
    temp_dir: Path | None = None
    factory: ClientFactory
    if server:
        factory = _remote(server, api_token, console)
    else:
        if state_dir is None:
            temp_dir = state_dir = Path(tempfile.mkdtemp(prefix="rollserve-run-"))
        config = _embedded_config(
            state_dir,
            backend,
            tokenizer,
            sandbox_runtime,
            parse_sandbox_options(sandbox_runtime, sandbox_options),
            (init_workers, run_workers, eval_workers),
            scoring_workers,
            concurrency,
            opts.handler_options,
        )
        factory = _local(config, console)
    rows = read_rows(file, data_source, console)
    try:
        code = asyncio.run(_run(rows, file, opts, factory, bool(server), console, out))
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    raise typer.Exit(code)


def _remote(url: str, token: str | None, console: Console) -> ClientFactory:
    @asynccontextmanager
    async def factory() -> AsyncIterator[tuple[AsyncClient, _ServerFacts]]:
        import httpx

        from rollserve.client import AsyncClient, RollserveError

        async with AsyncClient(url, token=token, timeout=60) as client:
            try:
                status = await client.status()
            except (httpx.HTTPError, RollserveError) as exc:
                console.print(
                    f"[red]error:[/red] cannot use the server at {escape(url)}: "
                    f"{escape(str(exc) or type(exc).__name__)}"
                )
                raise typer.Exit(2) from exc
            yield client, _ServerFacts(runtime=status.sandboxes.runtime, handlers=tuple(status.handlers))

    return factory


def _local(config: ServerConfig, console: Console) -> ClientFactory:
    @asynccontextmanager
    async def factory() -> AsyncIterator[tuple[AsyncClient, _ServerFacts]]:
        async with _embedded(config, console) as client:
            yield client, _ServerFacts()

    return factory

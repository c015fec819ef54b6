"""``rollserve quickstart``: the whole service on the embedded defaults, end to end.

Starts the HTTP service in this process with the embedded SmolLM2 model, submits a
mixed batch of bundled tasks (math, and code problems whose agent works in a
bubblewrap sandbox) through the real API as a trainer would, shows progress per
stage, then a summary, and writes every result as JSONL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from rollserve.client import AsyncClient
from rollserve.contract import RolloutResult, TaskRequest
from rollserve.datasets import bundled_rows
from rollserve.llm.tokens.tokenizer import TokenizerError
from rollserve.sandbox.base import SandboxError
from rollserve.server import ServerConfig, Service


@dataclass
class QuickstartOptions:
    tasks: int = 6  # math
    code_tasks: int = 2
    n: int = 2
    max_tokens: int = 192
    max_turns: int = 2
    temperature: float = 0.7
    out: Path = Path("quickstart-results.jsonl")
    state_dir: Path | None = None
    port: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_quickstart(opts: QuickstartOptions, console: Console) -> int:
    from rollserve.api.app import create_app

    state_dir = opts.state_dir or Path(tempfile.mkdtemp(prefix="rollserve-quickstart-"))
    port = opts.port or _free_port()
    config = ServerConfig(port=port, state_dir=state_dir, backends=["embedded"])
    console.print(f"[bold]rollserve quickstart[/bold]: state in {escape(str(state_dir))}, API on "
                  f"http://127.0.0.1:{port}")
    try:
        with console.status("loading the embedded model (SmolLM2-135M-Instruct)…"):
            service = Service(config)
            await service.start()
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    server = uvicorn.Server(uvicorn.Config(create_app(service, manage_lifecycle=False),
                                           host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                await serving
                console.print("[red]error:[/red] the HTTP server did not start")
                return 1
            await asyncio.sleep(0.05)
        if opts.code_tasks:
            try:
                await service.sandboxes.get()
            except SandboxError as exc:
                console.print(f"[yellow]note:[/yellow] no code tasks: {escape(str(exc))}")
                opts = dataclasses.replace(opts, code_tasks=0)
        async with AsyncClient(f"http://127.0.0.1:{port}") as client:
            return await _drive(client, opts, console)
    finally:
        server.should_exit = True
        await serving
        await service.stop()


async def _drive(client: AsyncClient, opts: QuickstartOptions, console: Console) -> int:
    run_tag = time.strftime("%Y%m%d-%H%M%S")
    tasks: list[TaskRequest] = []
    for source, rows in (("math", bundled_rows("math")[: opts.tasks]),
                         ("code", bundled_rows("code")[: opts.code_tasks])):
        for row in rows:
            instance = {k: v for k, v in row.items() if k != "task_id"}
            tasks.append(TaskRequest(id=f"{source}/{row['task_id']}@{run_tag}", data_source=source,
                                     instance=instance, n=opts.n))
    total = sum(t.n for t in tasks)
    started = time.perf_counter()
    accepted = await client.submit(
        tasks,
        sampling={"max_tokens": opts.max_tokens, "temperature": opts.temperature},
        agent={"max_turns": opts.max_turns},
    )
    console.print(f"submitted {len(tasks)} tasks × n={opts.n} = {total} rollouts "
                  f"in {len(accepted.groups)} groups")

    results: list[RolloutResult] = []
    columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bars = {name: progress.add_task(name, total=total) for name in ("init", "run", "eval", "done")}
        cursor = 0
        while len(results) < total:
            page = await client.results(after=cursor, limit=1000, wait=0.25)
            results.extend(page.results)
            cursor = page.next
            status = await client.status()
            # A stage's bar counts rollouts that have finished it (done) or are in it.
            for name, stage in status.stages.items():
                progress.update(bars[name], completed=min(total, stage.done),
                                description=f"{name} ({stage.busy} busy)")
            progress.update(bars["done"], completed=len(results))
    elapsed = time.perf_counter() - started

    with opts.out.open("w") as fh:
        for result in results:
            fh.write(json.dumps(result.model_dump(mode="json")) + "\n")
    _summary(results, elapsed, console)
    console.print(f"wrote {len(results)} results to [bold]{escape(str(opts.out))}[/bold]")
    return 0


def _summary(results: list[RolloutResult], elapsed: float, console: Console) -> None:
    table = Table(title="quickstart results (mean seconds per stage)")
    for col in ("task", "status", "n", "reward", "answered", "turns", "init", "run", "eval"):
        table.add_column(col, justify="right")
    by_status: dict[tuple[str, str], list[RolloutResult]] = {}
    for r in results:
        by_status.setdefault((r.data_source, r.status), []).append(r)

    def mean(values: list[float]) -> str:
        return f"{statistics.fmean(values):.2f}" if values else "-"

    for (source, status), rows in sorted(by_status.items()):
        rewards = [r.reward for r in rows if r.reward is not None]
        # "answered": the episode ended with an answer in the asked format (code: submitted).
        answered = sum(1 for r in rows if r.trajectory.ended_by == "finished")
        turns = statistics.fmean(r.stats.turns for r in rows)
        table.add_row(source, status, str(len(rows)),
                      f"{statistics.fmean(rewards):.3f}" if rewards else "-",
                      f"{answered}/{len(rows)}", f"{turns:.1f}",
                      mean([r.timing.init for r in rows]), mean([r.timing.run for r in rows]),
                      mean([r.timing.eval for r in rows]))
    console.print(table)
    output_tokens = sum(r.stats.output_tokens for r in results)
    console.print(
        f"{len(results)} rollouts in {elapsed:.1f}s · {output_tokens} tokens sampled · "
        f"{output_tokens / max(elapsed, 1e-9):.1f} tokens/s overall"
    )
    if results and not any(r.trajectory.ended_by == "finished" for r in results):
        console.print("[dim]SmolLM2-135M rarely writes its answer in \\boxed{} or calls a tool; a real "
                      "policy (rollserve serve --backend URL) does. The trajectories are still exact "
                      "and trainable.[/dim]")

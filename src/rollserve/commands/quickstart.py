"""``rollserve quickstart``: the whole service on the embedded defaults, end to end.

Starts the HTTP service in this process with the embedded SmolLM2 model (or
``--backend``), submits a mixed batch of bundled tasks through the real API as a
trainer would — easy two-choice questions the 135M model answers right some of the
time (``easy``: stem), math word problems, and code problems whose agent works in a
bubblewrap sandbox — shows progress per stage, then a table per data_source, and
writes every result as JSONL. Every rollout samples with its own seed (``--seed``
plus its position in the batch), so a run repeats where the backend is deterministic.
With ``--keep-serving`` the service stays up afterwards, its dashboard and API open,
until Ctrl-C (SIGINT) or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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

from rollserve.client import AsyncClient
from rollserve.commands.quickstart_summary import print_summary
from rollserve.contract import RolloutResult, SamplingParams, TaskRequest
from rollserve.datasets import bundled_set
from rollserve.llm.tokens import TokenizerError
from rollserve.sandbox.base import SandboxError
from rollserve.server import ServerConfig, Service

HOST = "127.0.0.1"
GRACEFUL_SHUTDOWN = 5  # seconds open requests (an event stream) get to end at shutdown
T = TypeVar("T")


@dataclass
class QuickstartOptions:
    easy_tasks: int = 8  # the bundled "easy" set (stem): two-choice questions
    tasks: int = 2  # math
    code_tasks: int = 2
    n: int = 2
    max_tokens: int = 64
    max_turns: int = 2
    temperature: float = 0.7
    seed: int = 0
    backend: str = "embedded"
    out: Path = Path("quickstart-results.jsonl")
    state_dir: Path | None = None
    port: int = 0
    keep_serving: bool = False


def _listen(port: int) -> socket.socket:
    """The API's socket, bound before anything starts (port 0: one the system picks), so
    a taken port is a clear error up front, never a failure inside the HTTP server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the quickstart takes SIGINT and SIGTERM
    itself (it stops the batch or the serving, then shuts everything down in order;
    uvicorn's would only stop the HTTP server, then raise the signal again). Shutting
    down calls ``handle_exit`` as uvicorn's handler would; nothing is re-raised."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Stopped(Exception):
    """SIGINT or SIGTERM came."""


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T:
    """``work``'s result, or ``_Stopped`` (``work`` cancelled) once ``stop`` is set."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise _Stopped
    return task.result()


async def run_quickstart(opts: QuickstartOptions, console: Console) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await _serve_and_drive(opts, console, stop)
    except _Stopped:
        console.print("[yellow]stopped[/yellow] (a signal came before the batch finished)")
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _serve_and_drive(opts: QuickstartOptions, console: Console, stop: asyncio.Event) -> int:

    try:
        sock = _listen(opts.port or 0)
    except OSError as exc:
        console.print(
            f"[red]error:[/red] port {opts.port}: {escape(exc.strerror or str(exc))} (choose another with --port)"
        )
        return 2
    with sock:
        return await _serve_on(sock, opts, console, stop)


async def _serve_on(sock: socket.socket, opts: QuickstartOptions, console: Console, stop: asyncio.Event) -> int:
    from rollserve.api.app import create_app

    port: int = sock.getsockname()[1]
    state_dir = opts.state_dir or Path(tempfile.mkdtemp(prefix="rollserve-quickstart-"))
    base = f"http://{HOST}:{port}"
    config = ServerConfig(host=HOST, port=port, state_dir=state_dir, backends=[opts.backend])
    console.print(f"[bold]rollserve quickstart[/bold]: state in {escape(str(state_dir))}, API on {base}")
    loading = (
        "loading the embedded model (SmolLM2-135M-Instruct)…"
        if opts.backend == "embedded"
        else f"starting with the backend {escape(opts.backend)}…"
    )
    service = Service(config)
    try:
        with console.status(loading):
            await service.start()  # bounded; a signal meanwhile is seen right after
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        await service.stop()  # what did start (scoring pool, backends) stops
        return 2
    # A dashboard left open holds an event stream: shutting down waits for it at most
    # GRACEFUL_SHUTDOWN seconds, then ends it.
    server = _Server(
        uvicorn.Config(
            create_app(service, manage_lifecycle=False),
            host=HOST,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                console.print("[red]error:[/red] the HTTP server did not start")
                return 1
            await asyncio.sleep(0.05)
        if opts.code_tasks:
            try:
                await service.sandboxes.get()
            except SandboxError as exc:
                console.print(f"[yellow]note:[/yellow] no code tasks: {escape(str(exc))}")
                opts = dataclasses.replace(opts, code_tasks=0)
        links = f"dashboard: [bold]{base}/ui[/bold] · API docs: {base}/docs · metrics: {base}/metrics"
        console.print(links)
        if stop.is_set():
            raise _Stopped
        async with AsyncClient(base) as client:
            code = await _unless_stopped(_drive(client, opts, console), stop)
        if code == 0 and opts.keep_serving and not stop.is_set():
            console.print(links)
            console.print(f"serving at {base} until stopped: Ctrl-C to stop")
            await stop.wait()
            console.print("stopping…")
        return code
    finally:
        # As a signal to uvicorn would (api.serving): long-polls and event streams (the
        # dashboard's) end now rather than at the timeout.
        service.begin_shutdown()
        server.handle_exit(signal.SIGTERM, None)
        try:
            await serving
        except (Exception, SystemExit) as exc:  # uvicorn exits on a failed start
            console.print(f"[red]error:[/red] the HTTP server: {escape(repr(exc))}")
        finally:
            await service.stop()


def quickstart_tasks(opts: QuickstartOptions) -> list[TaskRequest]:
    """The batch: per bundled set the first rows asked for, ``n`` single-sample tasks
    each; rollout ``j`` (in this order) samples with seed ``opts.seed + j``."""
    run_tag = time.strftime("%Y%m%d-%H%M%S")
    tasks: list[TaskRequest] = []
    for name, count in (("easy", opts.easy_tasks), ("math", opts.tasks), ("code", opts.code_tasks)):
        bundled = bundled_set(name)
        for row in bundled.rows()[:count]:
            instance = {k: v for k, v in row.items() if k != "task_id"}
            for sample in range(opts.n):
                seed = opts.seed + len(tasks)
                tasks.append(
                    TaskRequest(
                        id=f"{name}/{row['task_id']}/{sample}@{run_tag}",
                        data_source=bundled.data_source,
                        instance=instance,
                        sampling=SamplingParams(seed=seed),
                        metadata={"set": name, "task": row["task_id"], "sample": sample, "seed": seed},
                    )
                )
    return tasks


async def _drive(client: AsyncClient, opts: QuickstartOptions, console: Console) -> int:
    tasks = quickstart_tasks(opts)
    total = len(tasks)
    started = time.perf_counter()
    await client.submit(
        tasks,
        sampling={"max_tokens": opts.max_tokens, "temperature": opts.temperature},
        agent={"max_turns": opts.max_turns},
    )
    console.print(
        f"submitted {total} rollouts: {total // opts.n} tasks × {opts.n} samples, "
        f"seeds {opts.seed}..{opts.seed + total - 1}"
    )

    results: list[RolloutResult] = []
    columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bars = {name: progress.add_task(name, total=total) for name in ("init", "run", "eval", "done")}
        cursor = 0
        while len(results) < total:
            page = await client.results(after=cursor, limit=1000, wait=0.25, rescored=False)
            results.extend(page.results)
            cursor = page.next
            status = await client.status()
            # A stage's bar counts rollouts that have finished it (done) or are in it.
            for name, stage in status.stages.items():
                progress.update(bars[name], completed=min(total, stage.done), description=f"{name} ({stage.busy} busy)")
            progress.update(bars["done"], completed=len(results))
    elapsed = time.perf_counter() - started

    with opts.out.open("w") as fh:
        for result in results:
            fh.write(json.dumps(result.model_dump(mode="json")) + "\n")
    print_summary(results, elapsed, console)
    console.print(f"wrote {len(results)} results to [bold]{escape(str(opts.out))}[/bold]")
    return 0

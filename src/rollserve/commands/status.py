"""``rollserve status``: a running server's stage pools and, on a Ray cluster
(``serve --ray``), its nodes: slots, what each hosts and runs, sandboxes open."""

from __future__ import annotations

import httpx
import typer
from rich.console import Console
from rich.table import Table

from rollserve.contract import ServiceStatus

console = Console()


def status(
    server: str = typer.Option("http://127.0.0.1:8000", help="the rollserve server's URL"),
    api_token: str | None = typer.Option(None, envvar="ROLLSERVE_API_TOKEN", help="its bearer token"),
    timeout: float = typer.Option(10.0, min=0.1, help="seconds to wait for its answer"),
) -> None:
    """Show a running server's stages and nodes (GET /v1/status)."""
    headers = {"Authorization": f"Bearer {api_token}"} if api_token else {}
    try:
        reply = httpx.get(f"{server.rstrip('/')}/v1/status", headers=headers, timeout=timeout)
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {server}: {exc}")
        raise typer.Exit(1) from None
    for table in tables(ServiceStatus.model_validate(reply.json())):
        console.print(table)


def tables(status: ServiceStatus) -> list[Table]:
    stages = Table(
        title=f"stages ({status.in_flight} in flight of {status.max_pending}, {status.throughput_per_s:g}/s)"
    )
    for column in ("stage", "slots", "busy", "queued", "done"):
        stages.add_column(column, justify="left" if column == "stage" else "right")
    for name, pool in status.stages.items():
        stages.add_row(name, str(pool.workers), str(pool.busy), str(pool.queued), str(pool.done))
    if status.nodes is None:
        return [stages]
    nodes = Table(title="nodes (Ray)")
    for column in ("node", "state", "slots", "hosted", "init", "run", "eval", "placed", "lost", "sandboxes"):
        nodes.add_column(column, justify="left" if column in ("node", "state") else "right")
    for n in status.nodes:
        state = "draining" if n.alive and n.draining else "alive" if n.alive else "dead"
        nodes.add_row(
            n.name,
            state,
            str(n.slots),
            str(n.hosted),
            str(n.busy["init"]),
            str(n.busy["run"]),
            str(n.busy["eval"]),
            str(n.placed),
            str(n.lost),
            str(n.sandboxes_open),
        )
    return [stages, nodes]

"""``rollserve rescore``: EVAL again on a running server's stored results with another
evaluator (a new rubric, the family's grader as the server has it now), without
sampling (``POST /v1/results/rescore``); prints and optionally writes the new results.

It sends an idempotency key (``--idempotency-key``, else a new one), so its own retries
(a dropped connection, the server's "still running" 409) within
``--timeout`` get the first request's answer, never a second re-scoring."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollserve.contract import RolloutResult
from rollserve.contract.judge import JudgeRequest, RescoreRequest, RescoreResponse

console = Console()


def _ids(ids: list[str], results: Path | None) -> list[str]:
    found = [i for part in ids for i in part.split(",") if i.strip()]
    if results is not None:
        for line in results.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    found.append(str(json.loads(line)["id"]))
                except (ValueError, KeyError, TypeError):
                    raise typer.BadParameter(f"not a result line: {line[:80]!r}", param_hint="--results") from None
    if not found:
        raise typer.BadParameter("give result ids (--id) or a results file (--results)", param_hint="--id")
    return found


def _judge(rubric: str | None, judge: str | None) -> JudgeRequest | None:
    if judge is not None:
        try:
            return JudgeRequest.model_validate_json(judge)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--judge") from None
    return None if rubric is None else JudgeRequest(rubric=rubric)


RETRY_PAUSE = 2.0  # seconds between tries after a dropped connection


def _post(http: httpx.Client, body: RescoreRequest, timeout: float) -> httpx.Response:
    """The server's answer to ``body``, sent again (its key makes that safe) after a
    transport failure or a 409 saying the re-scoring still runs, until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            reply = http.post(
                "/v1/results/rescore",
                content=body.model_dump_json(),
                headers={"Content-Type": "application/json"},
                timeout=httpx.Timeout(min(30.0, max(left, 1.0)), read=max(left, 1.0)),
            )
        except httpx.TransportError as exc:
            if deadline - time.monotonic() <= RETRY_PAUSE:
                raise
            said = escape(str(exc) or type(exc).__name__)
            Console(stderr=True).print(f"[yellow]retrying[/yellow] the same request ({said})")
            time.sleep(RETRY_PAUSE)
            continue
        hint = reply.headers.get("retry-after") if reply.status_code == 409 else None
        if hint is None:
            return reply
        pause = float(hint) if hint.isdigit() else RETRY_PAUSE
        if deadline - time.monotonic() <= pause:
            return reply
        time.sleep(pause)


def rescore(
    server: str = typer.Option("http://127.0.0.1:8000", help="the rollserve server's URL"),
    ids: list[str] = typer.Option([], "--id", help="a stored result's id (comma-separated or repeated)"),
    results: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="a JSONL of results (rollserve run's output): every result in it"
    ),
    rubric: str | None = typer.Option(
        None, help="the server's rubric to judge by (none: the family's own grader alone)"
    ),
    judge: str | None = typer.Option(
        None, help="a judge request as JSON (an inline rubric, a reference), instead of --rubric"
    ),
    out: Path | None = typer.Option(None, help="write the new results here (JSONL)"),
    api_token: str | None = typer.Option(None, envvar="ROLLSERVE_API_TOKEN"),
    timeout: float = typer.Option(600.0, min=1.0, help="seconds to wait for the answer, retries included"),
    idempotency_key: str | None = typer.Option(
        None, help="the request's key (default: a new one): the same command again with it gets the first run's answer"
    ),
) -> None:
    """Score stored results again without sampling; the new ones are stored beside them."""
    result_ids, judged = _ids(ids, results), _judge(rubric, judge)
    try:
        body = RescoreRequest(
            result_ids=result_ids, judge=judged, idempotency_key=idempotency_key or f"cli-{uuid.uuid4().hex}"
        )
    except ValidationError as exc:  # (what the server would refuse, named by its option)
        field = str(exc.errors()[0]["loc"][0]) if exc.errors() and exc.errors()[0]["loc"] else ""
        hint = {"result_ids": "IDS / --results", "judge": "--rubric / --judge"}.get(field, "--idempotency-key")
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    base = server.rstrip("/")
    headers = {"Authorization": f"Bearer {api_token}"} if api_token else {}
    with httpx.Client(base_url=base, headers=headers, timeout=timeout) as http:
        try:
            reply = _post(http, body, timeout)
        except httpx.HTTPError as exc:
            Console(stderr=True).print(f"[red]error:[/red] {escape(server)}: {exc}")
            raise typer.Exit(1) from None
        if reply.status_code != 200:
            Console(stderr=True).print(f"[red]refused ({reply.status_code}):[/red] {escape(reply.text[:2000])}")
            raise typer.Exit(1)
        answer = RescoreResponse.model_validate(reply.json())
        table = Table(title=f"re-scored ({answer.scoring})")
        for column in ("from", "new id", "reward", "masked"):
            table.add_column(column)
        for r in answer.results:
            table.add_row(
                escape(r.rescored_from), escape(r.id), "-" if r.reward is None else f"{r.reward:.4g}", str(r.mask)
            )
        console.print(table)
        if out is not None:
            lines = []
            for r in answer.results:
                view = http.get(f"/v1/rollouts/{r.id}").json()
                lines.append(RolloutResult.model_validate(view["result"]).model_dump_json())
            out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            console.print(f"wrote [bold]{escape(str(out))}[/bold]")

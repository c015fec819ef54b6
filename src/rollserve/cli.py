"""Command line: ``rollserve serve | quickstart | fake-llm``."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from rollserve.engine.pipeline import EngineConfig
from rollserve.server import ServerConfig, default_state_dir

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="rollserve: rollout-as-a-service for RL of multi-turn LLM agents.")
console = Console(stderr=True)


def _engine_config(init_workers: int, run_workers: int, eval_workers: int, max_pending: int,
                   on_restart: str, retention_hours: float) -> EngineConfig:
    return EngineConfig(init_workers=init_workers, run_workers=run_workers,
                        eval_workers=eval_workers, max_pending=max_pending,
                        on_restart=on_restart, retention_s=retention_hours * 3600)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port to listen on"),
    state_dir: Path = typer.Option(default_state_dir(), help="where the store and sandboxes' owner records live"),
    store: Optional[Path] = typer.Option(None, help="SQLite file (default: STATE_DIR/rollserve.db)"),
    backend: list[str] = typer.Option([], "--backend", "-b",
                                      help="inference backend: a vLLM URL, or 'embedded'; repeatable"),
    tokenizer: str = typer.Option("smollm2", help="policy tokenizer: a HF tokenizer folder, a .gguf, or 'smollm2'"),
    init_workers: int = typer.Option(32, help="concurrent INIT stages"),
    run_workers: int = typer.Option(256, help="concurrent RUN stages (agent loops)"),
    eval_workers: int = typer.Option(16, help="concurrent EVAL stages"),
    scoring_workers: int = typer.Option(2, help="processes for CPU-heavy scoring"),
    max_pending: int = typer.Option(10_000, help="rollouts admitted and unfinished before 429"),
    on_restart: str = typer.Option("requeue", help="unfinished rollouts at start: requeue | interrupt"),
    retention_hours: float = typer.Option(168.0, help="keep finished results this long"),
    api_token: Optional[str] = typer.Option(None, envvar="ROLLSERVE_API_TOKEN",
                                            help="require 'Authorization: Bearer TOKEN' (all routes but /healthz)"),
    log_level: str = typer.Option("info"),
) -> None:
    """Run the rollout service (no inference backend unless --backend is given)."""
    import uvicorn

    from rollserve.api.app import create_app
    from rollserve.server import Service

    from rollserve.llm.factory import parse_backend_spec

    if on_restart not in ("requeue", "interrupt"):
        raise typer.BadParameter("must be 'requeue' or 'interrupt'", param_hint="--on-restart")
    for spec in backend:
        try:
            parse_backend_spec(spec)
        except ValueError as exc:
            raise typer.BadParameter(f"{exc} (e.g. http://gpu-node:8000 or embedded)",
                                     param_hint="--backend") from exc
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServerConfig(
        host=host, port=port, state_dir=state_dir, store_path=store, api_token=api_token,
        tokenizer=tokenizer, backends=backend, scoring_workers=scoring_workers,
        engine=_engine_config(init_workers, run_workers, eval_workers, max_pending,
                              on_restart, retention_hours),
    )
    service = _make_service(config)
    uvicorn.run(create_app(service), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=10)


def _make_service(config: ServerConfig):
    from rollserve.llm.tokenizer import TokenizerError
    from rollserve.server import Service

    try:
        return Service(config)
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)


@app.command()
def quickstart(
    tasks: int = typer.Option(8, min=1, help="bundled math tasks to run"),
    n: int = typer.Option(2, min=1, help="samples per task (a GRPO group)"),
    max_tokens: int = typer.Option(192, min=1, help="new tokens per turn"),
    max_turns: int = typer.Option(2, min=1, help="turns per episode"),
    temperature: float = typer.Option(0.7, min=0.0),
    out: Path = typer.Option(Path("quickstart-results.jsonl"), help="results as JSONL"),
    state_dir: Optional[Path] = typer.Option(None, help="default: a fresh temporary folder"),
    port: int = typer.Option(0, help="0 picks a free port"),
) -> None:
    """Start rollserve on the embedded defaults, run bundled math tasks, show results."""
    from rollserve.quickstart import QuickstartOptions, run_quickstart

    options = QuickstartOptions(tasks=tasks, n=n, max_tokens=max_tokens, max_turns=max_turns,
                                temperature=temperature, out=out, state_dir=state_dir, port=port)
    code = asyncio.run(run_quickstart(options, console))
    raise typer.Exit(code)


@app.command("fake-llm")
def fake_llm(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8100),
    latency: float = typer.Option(0.0, help="seconds per call"),
    reply: list[str] = typer.Option(["The answer is \\boxed{42}."], help="scripted replies, cycled"),
    capacity: Optional[int] = typer.Option(None, help="concurrent slots, like a GPU's batch"),
    tokenizer: str = typer.Option("smollm2"),
) -> None:
    """Run the scripted vLLM-compatible test server (test handlers without a GPU)."""
    from rollserve.testing.fake_vllm import main as fake_main

    argv = ["--host", host, "--port", str(port), "--latency", str(latency),
            "--tokenizer", tokenizer, "--reply", *reply]
    if capacity:
        argv += ["--capacity", str(capacity)]
    fake_main(argv)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":
    main()

"""The command line: ``rollserve serve | quickstart | fake-llm | datasets | images | run |
report``.

It needs the server's packages (``rollserve[server]``); ``rollserve.cli`` loads it and
says so in a client-only install."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from rollserve.api.prorl import DEFAULT_PORT as PRORL_PORT
from rollserve.api.prorl import ProRLConfig
from rollserve.cluster.protocol import RayConfig
from rollserve.commands import datasets as datasets_cmd
from rollserve.commands import harness as harness_cmd
from rollserve.commands import images as images_cmd
from rollserve.commands import report as report_cmd
from rollserve.commands import rescore as rescore_cmd
from rollserve.commands import run as run_cmd
from rollserve.commands import status as status_cmd
from rollserve.commands.defaults import (
    ENGINE,
    HOUR,
    MAX_INSTANCE_MB,
    MAX_REQUEST_MB,
    PRORL,
    QUICKSTART,
    RETENTION_HOURS,
    ROUTER,
    SERVER,
)
from rollserve.commands.options import check_backends, check_judges, parse_rubrics
from rollserve.commands.options import handler_options as parse_handler_options
from rollserve.commands.options import sandbox_options as parse_sandbox_options
from rollserve.engine.pipeline import EngineConfig
from rollserve.engine.requests import MIB, RequestLimits
from rollserve.llm.tokens import DEFAULT_TOKENIZER
from rollserve.server import ServerConfig, Service

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="rollserve: rollout-as-a-service for RL of multi-turn LLM agents."
)
console = Console(stderr=True)


def _engine_config(
    init_workers: int, run_workers: int, eval_workers: int, max_pending: int, on_restart: str, retention_hours: float
) -> EngineConfig:
    return EngineConfig(
        init_workers=init_workers,
        run_workers=run_workers,
        eval_workers=eval_workers,
        max_pending=max_pending,
        on_restart=on_restart,
        retention_s=retention_hours * HOUR,
    )


@app.command()
def serve(
    host: str = typer.Option(SERVER.host, help="address to listen on"),
    port: int | None = typer.Option(None, help=f"port to listen on (default {SERVER.port}; {PRORL_PORT} with --prorl)"),
    state_dir: Path = typer.Option(SERVER.state_dir, help="where the store and sandboxes' owner records live"),
    store: Path | None = typer.Option(SERVER.store_path, help="SQLite file (default: STATE_DIR/rollserve.db)"),
    backend: list[str] = typer.Option(
        list(SERVER.backends),
        "--backend",
        "-b",
        help="inference backend: a vLLM URL, 'embedded', or KIND=URL (vllm, sglang, llamacpp, openai_chat); repeatable",
    ),
    judge: list[str] = typer.Option(
        [],
        "--judge",
        help="a judge called at EVAL, never the "
        "policy: NAME=URL (an OpenAI-compatible chat API), "
        "NAME=embedded, NAME=KIND=URL, or a JSON object with "
        "concurrency, timeout, retries...; repeatable (docs/judges.md)",
    ),
    rubric: list[str] = typer.Option(
        [], "--rubric", help="a named rubric tasks' judge may ask for: NAME=JSON (or NAME=@file.json); repeatable"
    ),
    default_judge: str | None = typer.Option(
        None, help="a rubric ('default' or a --rubric name) every task without its own judge gets"
    ),
    routing: str = typer.Option(
        ROUTER.policy,
        help="routing policy: least_load | least_outstanding | prorl_cumulative | round_robin | hash_sticky",
    ),
    forward_pause: bool = typer.Option(
        ROUTER.forward_pause, help="forward pause/resume to backends that support it (vLLM dev mode, SGLang)"
    ),
    max_staleness: int | None = typer.Option(
        ENGINE.max_staleness, min=0, help="flag rollouts whose turns span more policy versions than this"
    ),
    mask_stale: bool = typer.Option(ENGINE.mask_stale, help="mask (do not train on) rollouts flagged stale"),
    tokenizer: str = typer.Option(
        SERVER.tokenizer,
        help="policy tokenizer: a HF tokenizer folder, "
        f"a .gguf, '{DEFAULT_TOKENIZER}', or vllm:URL (the serving "
        "vLLM's /tokenize)",
    ),
    init_workers: int = typer.Option(ENGINE.init_workers, help="concurrent INIT stages"),
    run_workers: int = typer.Option(ENGINE.run_workers, help="concurrent RUN stages (agent loops)"),
    eval_workers: int = typer.Option(ENGINE.eval_workers, help="concurrent EVAL stages"),
    scoring_workers: int = typer.Option(SERVER.scoring_workers, help="processes for CPU-heavy scoring"),
    sandbox_runtime: str = typer.Option(
        SERVER.sandbox_runtime,
        help="where agents' tools run: bubblewrap | apptainer | "
        "singularity | docker | podman | local (no isolation: development only)",
    ),
    sandbox_options: str | None = typer.Option(
        None, help='the runtime\'s options as JSON, e.g. \'{"readonly_paths": ["/opt/conda"]}\''
    ),
    sandbox_pool: int = typer.Option(
        SERVER.sandbox_pool,
        min=0,
        max=4096,
        help="keep up to this many sandboxes started ahead of demand for INIT to take (each used once); 0: none",
    ),
    gc_freeze: bool = typer.Option(
        SERVER.gc_freeze,
        help="after start-up, freeze what start-up made (gc.freeze()) so full garbage collections skip it",
    ),
    gc_gen0: int = typer.Option(
        SERVER.gc_gen0,
        min=700,
        max=10_000_000,
        help="the garbage collector's young-generation threshold once started (Python's: 700)",
    ),
    rollout_slice_ms: float = typer.Option(
        SERVER.rollout_slice_ms,
        min=0,
        max=1000,
        help="run the rollouts' work in slices of this many ms between passes over the API's requests; 0: one queue",
    ),
    handler_options: str | None = typer.Option(
        None, help='handlers\' settings as JSON by handler, e.g. \'{"swe": {"mirrors": ["/data/mirrors"]}}\''
    ),
    max_pending: int = typer.Option(ENGINE.max_pending, help="rollouts admitted and unfinished before 429"),
    on_restart: str = typer.Option(ENGINE.on_restart, help="unfinished rollouts at start: requeue | interrupt"),
    retention_hours: float = typer.Option(RETENTION_HOURS, help="keep finished results this long"),
    api_token: str | None = typer.Option(
        SERVER.api_token,
        envvar="ROLLSERVE_API_TOKEN",
        help="require 'Authorization: Bearer TOKEN' (all routes but /healthz)",
    ),
    public_docs: bool = typer.Option(
        SERVER.public_docs,
        "--public-docs",
        help="with --api-token: serve /openapi.json, /docs and /redoc without the token",
    ),
    max_request_mb: float = typer.Option(MAX_REQUEST_MB, min=0.001, help="largest request body in MiB (413 beyond)"),
    max_instance_mb: float = typer.Option(
        MAX_INSTANCE_MB, min=0.001, help="largest task instance (or metadata) in MiB of JSON (422 beyond)"
    ),
    prorl: bool = typer.Option(
        False, "--prorl", help="also serve ProRL Agent's API (/start, /process, /add_llm_server, ...) for its clients"
    ),
    prorl_timeout: float | None = typer.Option(
        PRORL.timeout, min=1, help="--prorl: seconds per job (default: the handler's)"
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        help="run the stages on a Ray cluster's "
        "nodes: 'auto' or the head's host:port (needs rollserve[ray]; "
        "a worker starts on each node with the --ray-resource resource)",
    ),
    ray_resource: str = typer.Option(
        "rollserve", help="--ray: the Ray resource a node offers rollserve; its amount is the node's slots"
    ),
    public_seeds: bool = typer.Option(
        SERVER.public_seeds,
        "--public-seeds",
        help="seed generated (reasoning-gym) instances with their "
        "public seed as it is (default: salted with a secret "
        "kept in the store, so a policy cannot regenerate them)",
    ),
    harness_dir: Path | None = typer.Option(
        None,
        envvar="ROLLSERVE_HARNESS_DIR",
        help="where `rollserve harness install` put the "
        "harness presets (default ~/.cache/rollserve/harnesses); shipped to --ray workers",
    ),
    log_level: str = typer.Option("info"),
) -> None:
    """Run the rollout service (no inference backend unless --backend is given)."""
    from rollserve.api.app import create_app
    from rollserve.api.serving import serve
    from rollserve.engine.priority import slice_problem
    from rollserve.llm.routing import POLICIES, RouterConfig

    if routing not in POLICIES:
        raise typer.BadParameter(f"must be one of {', '.join(POLICIES)}", param_hint="--routing")
    options = parse_sandbox_options(sandbox_runtime, sandbox_options)
    by_handler = parse_handler_options(handler_options)
    if on_restart not in ("requeue", "interrupt"):
        raise typer.BadParameter("must be 'requeue' or 'interrupt'", param_hint="--on-restart")
    slice_wrong = slice_problem(rollout_slice_ms)
    if slice_wrong is not None:
        raise typer.BadParameter(slice_wrong, param_hint="--rollout-slice-ms")
    check_backends(backend)
    check_judges(judge)
    rubrics = parse_rubrics(rubric)
    if default_judge is not None and (not judge or default_judge not in {"default", *rubrics}):
        raise typer.BadParameter(
            "needs a --judge and a rubric: 'default' or a --rubric name", param_hint="--default-judge"
        )
    port = port if port is not None else (PRORL_PORT if prorl else SERVER.port)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServerConfig(
        host=host,
        port=port,
        state_dir=state_dir,
        store_path=store,
        api_token=api_token,
        public_docs=public_docs,
        limits=RequestLimits(
            max_request_bytes=int(max_request_mb * MIB), max_instance_bytes=int(max_instance_mb * MIB)
        ),
        tokenizer=tokenizer,
        backends=backend,
        scoring_workers=scoring_workers,
        sandbox_runtime=sandbox_runtime,
        sandbox_options=options,
        sandbox_pool=sandbox_pool,
        gc_freeze=gc_freeze,
        gc_gen0=gc_gen0,
        rollout_slice_ms=rollout_slice_ms,
        handler_options=by_handler,
        engine=_engine_config(
            init_workers, run_workers, eval_workers, max_pending, on_restart, retention_hours
        ).model_copy(update={"max_staleness": max_staleness, "mask_stale": mask_stale}),
        llm=RouterConfig(policy=routing, forward_pause=forward_pause),
        ray=None if ray is None else RayConfig(address=ray, resource=ray_resource),
        public_seeds=public_seeds,
        harness_dir=harness_dir,
        judges=list(judge),
        rubrics=rubrics,
        default_judge=default_judge,
    )
    if ray is not None:
        _check_ray()
    service = _make_service(config)
    prorl_config = ProRLConfig(timeout=prorl_timeout) if prorl else None
    # A signal ends the long-polls and event streams at once (api.serving); the graceful
    # timeout bounds what else is open (a harness's LLM call in flight).
    serve(
        create_app(service, prorl=prorl_config),
        service,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=10,
        freeze_heap=config.gc_freeze,
        gc_gen0=config.gc_gen0,
        rollout_slice_ms=config.rollout_slice_ms or None,
    )


def _check_ray() -> None:
    try:
        import ray  # noqa: F401
    except ModuleNotFoundError:
        console.print("[red]error:[/red] --ray needs Ray: pip install 'rollserve[ray]'")
        raise typer.Exit(2) from None


def _make_service(config: ServerConfig) -> Service:
    from rollserve.engine.weights_file import WeightsFileError
    from rollserve.llm.tokens import TokenizerError

    try:
        return Service(config)
    except (TokenizerError, WeightsFileError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    except ValueError as exc:  # a handler's settings (--handler-options)
        raise typer.BadParameter(str(exc), param_hint="--handler-options") from exc


@app.command()
def quickstart(
    easy_tasks: int = typer.Option(
        QUICKSTART.easy_tasks,
        min=0,
        help="bundled easy tasks to run (stem: two-choice questions the small model gets right some of the time)",
    ),
    tasks: int = typer.Option(QUICKSTART.tasks, min=0, help="bundled math tasks to run"),
    code_tasks: int = typer.Option(
        QUICKSTART.code_tasks,
        min=0,
        help="bundled code tasks to run (the agent works in a bubblewrap sandbox; skipped without one)",
    ),
    n: int = typer.Option(QUICKSTART.n, min=1, help="samples per task, each with its own seed"),
    max_tokens: int = typer.Option(QUICKSTART.max_tokens, min=1, help="new tokens per turn"),
    max_turns: int = typer.Option(QUICKSTART.max_turns, min=1, help="turns per episode"),
    temperature: float = typer.Option(QUICKSTART.temperature, min=0.0),
    seed: int = typer.Option(QUICKSTART.seed, min=0, help="rollout j of the batch samples with seed SEED + j"),
    backend: str = typer.Option(
        QUICKSTART.backend,
        help="the policy: 'embedded' (SmolLM2-135M in this process), a vLLM URL, or KIND=URL as for serve",
    ),
    keep_serving: bool = typer.Option(
        QUICKSTART.keep_serving,
        "--keep-serving",
        help="after the batch, keep the service (dashboard, API) up until Ctrl-C or SIGTERM",
    ),
    out: Path = typer.Option(QUICKSTART.out, help="results as JSONL"),
    state_dir: Path | None = typer.Option(QUICKSTART.state_dir, help="default: a fresh temporary folder"),
    port: int = typer.Option(QUICKSTART.port, help="0 picks a free port"),
) -> None:
    """Start rollserve on the embedded defaults, run bundled easy, math and code tasks, show
    the results per data_source."""
    from rollserve.commands.quickstart import QuickstartOptions, run_quickstart

    if easy_tasks + tasks + code_tasks == 0:
        raise typer.BadParameter(
            "nothing to run: give --easy-tasks, --tasks or --code-tasks above 0", param_hint="--tasks"
        )
    check_backends([backend])
    options = QuickstartOptions(
        easy_tasks=easy_tasks,
        tasks=tasks,
        code_tasks=code_tasks,
        n=n,
        max_tokens=max_tokens,
        max_turns=max_turns,
        temperature=temperature,
        seed=seed,
        backend=backend,
        keep_serving=keep_serving,
        out=out,
        state_dir=state_dir,
        port=port,
    )
    code = asyncio.run(run_quickstart(options, console))
    raise typer.Exit(code)


@app.command("fake-llm")
def fake_llm(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8100),
    latency: float = typer.Option(0.0, help="seconds per call"),
    reply: list[str] = typer.Option(["The answer is \\boxed{42}."], help="scripted replies, cycled"),
    script: Path | None = typer.Option(
        None,
        help="a Python file defining reply(prompt_ids, prompt) -> str: a per-rollout, "
        "multi-turn policy (replaces --reply; see rollserve.testing.scripted_policy)",
    ),
    capacity: int | None = typer.Option(None, help="concurrent slots, like a GPU's batch"),
    tokenizer: str = typer.Option(DEFAULT_TOKENIZER),
) -> None:
    """Run the scripted vLLM-compatible test server (test handlers without a GPU)."""
    from rollserve.testing.fake_vllm import main as fake_main

    argv = ["--host", host, "--port", str(port), "--latency", str(latency), "--tokenizer", tokenizer]
    if script is not None:  # a bad file is named by fake_main, before anything starts
        argv += ["--script", str(script)]
    else:
        argv += ["--reply", *reply]
    if capacity:
        argv += ["--capacity", str(capacity)]
    fake_main(argv)


# Dataset tooling (rollserve.commands): validate rows, pull their images, run them.
app.add_typer(datasets_cmd.app, name="datasets")
app.add_typer(images_cmd.app, name="images")
app.add_typer(harness_cmd.app, name="harness")
app.command("run", help=run_cmd.HELP)(run_cmd.run)
app.command("report")(report_cmd.report)
app.command("status")(status_cmd.status)
app.command("rescore")(rescore_cmd.rescore)

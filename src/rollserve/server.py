"""The composition root: builds store, handlers, router and engine from settings."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

from rollserve.agent.gateway import Gateway
from rollserve.agent.harnesses.install import install_root, system_node_version
from rollserve.cluster.protocol import RayConfig, WorkerSettings
from rollserve.contract import SandboxStatus
from rollserve.contract.judge import JudgeRequest, Rubric
from rollserve.engine import weights_file
from rollserve.engine.executor import StageExecutor
from rollserve.engine.facade import Rollouts
from rollserve.engine.gateway import Gateways
from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.priority import slice_problem
from rollserve.engine.requests import RequestLimits
from rollserve.engine.store import SQLiteStore
from rollserve.errors import RolloutError
from rollserve.handlers import HandlerRegistry, ScoringPool, UnknownDataSource
from rollserve.handlers.base import HandlerContext
from rollserve.llm.backends import backend_from_spec, parse_backend_spec
from rollserve.llm.judges import Judge, Judges, check_unique, parse_judge_spec
from rollserve.llm.routing import Router, RouterConfig
from rollserve.llm.tokens import DEFAULT_TOKENIZER, load_tokenizer
from rollserve.sandbox.base import SandboxError
from rollserve.sandbox.reaper import reap
from rollserve.sandbox.registry import RUNTIMES, LazyRuntime
from rollserve.sandbox.sandbox_python import SandboxPython

if TYPE_CHECKING:
    from rollserve.cluster.executor import RayExecutor

log = logging.getLogger(__name__)

# A serving backend's tokenizer that did not answer at start is probed again: first
# after this many seconds, doubling up to the most (each probe is bounded by its HTTP timeout).
TOKENIZER_REPROBE_FIRST = 0.5
TOKENIZER_REPROBE_MAX = 30.0


def default_state_dir() -> Path:
    return Path(os.environ.get("ROLLSERVE_STATE_DIR", "~/.local/state/rollserve")).expanduser()


def _warm_imports() -> None:
    for module in ("reasoning_gym",):
        try:
            importlib.import_module(module)
        except ImportError:
            log.warning("could not import %s; its tasks will fail validation", module)
    # The host's `node --version` (up to 20 s, then cached), which an npm harness
    # preset's check at submit reads: asked here, off the event loop.
    system_node_version()


def _reap_report(report) -> dict:
    summary = {
        "sandboxes": len(report.reaped),
        "processes_killed": len(report.killed),
        "kept_live_owners": len(report.kept),
        "errors": report.errors,
    }
    if report.reaped or report.errors:
        log.warning("start-up reaper: %s", summary)
    else:
        log.info("start-up reaper: nothing to reap (%d sandboxes of live servers kept)", len(report.kept))
    return summary


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    state_dir: Path = Field(default_factory=default_state_dir)
    store_path: Path | None = None  # default: <state_dir>/rollserve.db
    api_token: str | None = None
    public_docs: bool = Field(
        False,
        description="with api_token: /openapi.json, /docs and /redoc without the token (they are behind it otherwise)",
    )
    limits: RequestLimits = Field(default_factory=RequestLimits)
    tokenizer: str = Field(
        DEFAULT_TOKENIZER,
        description="a HF tokenizer folder, a .gguf, "
        f"'{DEFAULT_TOKENIZER}', or vllm:URL (the serving vLLM's /tokenize)",
    )
    backends: list[str] = Field(default_factory=list)
    llm: RouterConfig = Field(default_factory=RouterConfig)
    scoring_workers: int = Field(2, ge=1)
    scoring_timeout: float = Field(10.0, gt=0)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sandbox_runtime: str = Field(
        "bubblewrap",
        description="where tools run: bubblewrap | apptainer | singularity | "
        "docker | podman | local (created on first use; see rollserve.sandbox)",
    )
    sandbox_options: dict[str, Any] = Field(
        default_factory=dict,
        description="the runtime's config, e.g. bubblewrap "
        '{"readonly_paths": ["/opt/conda"]}, apptainer {"fakeroot": true, "image_cache": "..."}',
    )
    sandbox_pool: int = Field(
        0,
        ge=0,
        le=4096,
        description="a warm pool of at most this many started sandboxes "
        "that INIT takes from (sized by the recent demand per spec; each used by one rollout, "
        "never reused; docs/sandboxes.md); 0: none, every sandbox starts cold",
    )
    gc_freeze: bool = Field(
        True,
        description="after start-up, move every object the start-up made (imported modules, models, the "
        "tokenizer) out of the garbage collector's reach (gc.freeze()), so that no full collection walks "
        "them again; what rollouts make is collected as before (docs/service.md)",
    )
    gc_gen0: int = Field(
        50_000,
        ge=700,
        le=10_000_000,
        description="the garbage collector's young-generation threshold once started (Python's is 700): "
        "fewer young collections, so fewer objects promoted and far fewer full collections; "
        "cycles are still collected (docs/service.md)",
    )
    rollout_slice_ms: float = Field(
        5.0,
        ge=0,
        le=1000,
        description="the event loop runs the rollouts' work in slices of about this many milliseconds, "
        "each pass after the API's requests and the I/O, so that status and result reads answer while "
        "the rollouts keep the CPU busy; 0: one first-come queue for all (docs/service.md)",
    )
    handler_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per handler (by data_source) its settings, e.g. "
        '{"swe": {"mirrors": ["/data/mirrors"], "image_prefix": "myreg/sweb.eval.x86_64."}}',
    )
    ray: RayConfig | None = Field(
        None,
        description="run the stages on a Ray cluster's nodes (rollserve.cluster; the rollserve[ray] extra); None: here",
    )
    harness_dir: Path | None = Field(
        None,
        description="the harness presets' install root "
        "(`rollserve harness install`); None: $ROLLSERVE_HARNESS_DIR, "
        "else ~/.cache/rollserve/harnesses",
    )
    judges: list[str | dict[str, Any]] = Field(
        default_factory=list,
        description="judges called at EVAL, never the policy "
        "(llm.judges: NAME=URL, NAME=embedded, or a JSON object; docs/judges.md)",
    )
    rubrics: dict[str, Rubric] = Field(
        default_factory=dict,
        description="named rubrics a task's judge may name (contract.judge.Rubric), beside the built-in 'default'",
    )
    default_judge: str | None = Field(
        None,
        description="a rubric every task is judged by when neither it nor its batch "
        "names one ('default' or a --rubric name); None: the family's outcome alone",
    )
    public_seeds: bool = Field(
        False,
        description="seed generated instances (reasoning-gym) "
        "with their public seed as it is, reproducible by anyone; default: "
        "salted with the store's secret salt (handlers.seeds)",
    )

    @field_validator("judges")
    @classmethod
    def _judges(cls, specs: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        check_unique(parse_judge_spec(spec).name for spec in specs)  # ValueError naming it
        return specs

    @field_validator("rollout_slice_ms")
    @classmethod
    def _slice(cls, ms: float) -> float:
        problem = slice_problem(ms)
        if problem is not None:
            raise ValueError(problem)
        return ms

    @field_validator("sandbox_runtime")
    @classmethod
    def _known_runtime(cls, name: str) -> str:
        if name not in RUNTIMES:
            raise ValueError(f"unknown sandbox runtime {name!r}; known: {', '.join(RUNTIMES)}")
        return name

    @property
    def db_path(self) -> Path:
        return self.store_path or self.state_dir / "rollserve.db"


class Service:
    """Everything one rollserve node runs, started and stopped together."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.tokenizer = load_tokenizer(config.tokenizer)
        self.store = SQLiteStore(config.db_path)
        self.scoring = ScoringPool(workers=config.scoring_workers, default_timeout=config.scoring_timeout)
        # The weights in force when this state dir's server last stopped (the inference
        # servers still hold them): an adapter's name and the policy version.
        self.weights_path = weights_file.weights_path(config.db_path)
        restored = weights_file.read(self.weights_path)  # WeightsFileError: no start
        self._weights_lock = asyncio.Lock()  # one write of the record at a time
        if restored is None:
            self.router = Router(config=config.llm)
        else:
            log.info("weights in force restored from %s: %s", self.weights_path, restored.model_dump_json())
            self.router = Router(
                config=config.llm,
                policy_version=restored.policy_version,
                lora=restored.lora,
                last_load=restored.last_load,
                paused=restored.paused,
            )
            if restored.paused:
                log.warning(
                    "the last weight load (%s) was not followed by a resume before this "
                    "server stopped: generation starts paused until POST /v1/llm/resume "
                    "names the new weights' policy version",
                    self.weights_path,
                )
        self.handlers = HandlerRegistry()
        # Created on first use: a host without the runtime (no bwrap) still serves math.
        self.sandboxes = LazyRuntime(
            config.sandbox_runtime, config.state_dir, config.sandbox_options, pool=config.sandbox_pool
        )
        self.reaped: dict | None = None  # what the start-up reaper cleaned up
        self._sandbox_python: asyncio.Task[object] | None = None  # made at start
        self._tokenizer_probe: asyncio.Task[None] | None = None  # until a late one answers
        gateway = Gateway()  # harness-driven rollouts' sessions (agent.gateway)
        # The harness presets' install root, resolved once: for the handlers and the Ray workers.
        self.harness_dir = str(install_root(config.harness_dir))
        self.judges = Judges([self._judge(spec) for spec in config.judges])
        context = HandlerContext(
            tokenizer=self.tokenizer,
            scoring=self.scoring,
            sandboxes=self.sandboxes,
            options=config.handler_options,
            gateway=gateway,
            harness_dir=self.harness_dir,
            judges=self.judges,
            rubrics=config.rubrics,
            default_judge=None if config.default_judge is None else JudgeRequest(rubric=config.default_judge),
        )
        if context.default_judge is not None:  # a bad default fails now, not at each submit
            problem = context.judge_problem(context.default_judge)
            if problem is not None:
                raise ValueError(f"default_judge: {problem[0]}: {problem[1]}")
        for name in config.handler_options:  # bad settings fail now, not at the first rollout
            try:
                self.handlers.create(name, context)
            except UnknownDataSource as exc:
                raise ValueError(f"handler options for {name!r}: {exc}") from None
        self.cluster: RayExecutor | None = self._cluster() if config.ray is not None else None
        executor: StageExecutor | None = self.cluster
        if self.cluster is not None:  # the nodes' router replicas pause and resume with ours
            self.router.followers.append(self.cluster)
        self.context = context  # its seed_salt is read from the store at start
        self.engine = Engine(self.store, self.handlers, self.router, config.engine, context, executor=executor)
        if self.cluster is not None:  # a node's slots bound its stages, not the head's pools
            self.cluster.on_slots = self._size_pools
        self.rollouts = Rollouts(self.engine, config.limits)  # what the API calls
        self.gateways = Gateways(gateway, closing=self.engine.events.closing)  # the gateway's routes

    def _size_pools(self, slots: int) -> None:
        """With --ray each stage pool is as large as the alive nodes' slots together: a
        node's slots bound what it hosts, and a smaller pool (the one-machine defaults:
        32 INIT, 16 EVAL) would cap the whole cluster's stages at its size."""
        for pool in self.engine.pools.values():
            pool.resize(slots)

    def _cluster(self) -> RayExecutor:
        """Stages on a Ray cluster's nodes: each node's worker is built from these settings."""
        from rollserve.cluster.executor import RayExecutor  # imports ray: only with --ray

        config = self.config
        assert config.ray is not None
        settings = WorkerSettings(
            node="",
            state_dir=config.state_dir.expanduser().resolve(),
            tokenizer=config.tokenizer,
            backends=config.backends,
            llm=config.llm,
            scoring_workers=config.scoring_workers,
            scoring_timeout=config.scoring_timeout,
            sandbox_runtime=config.sandbox_runtime,
            sandbox_options=config.sandbox_options,
            handler_options=config.handler_options,
            harness_dir=self.harness_dir,
            lora=self.router.lora,
        )  # restored at start: workers name it from the first call
        router = self.router
        executor = RayExecutor(config.ray, settings, policy_version=lambda: router.policy_version)
        if router.pause_mode is not None:  # restored paused: workers join paused
            executor.start_paused(router.pause_mode)
        return executor

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        await self.store.open()
        # Made once per store and kept there; never in a prompt (handlers.seeds).
        self.context.seed_salt = None if self.config.public_seeds else await self.store.seed_salt()
        # Sandboxes a dead predecessor left (owner records under the state dir); in a
        # thread: it waits for killed processes to go.
        self.reaped = _reap_report(await asyncio.to_thread(reap, self.config.state_dir))
        await self.scoring.astart()
        # The sandbox runtime now, not at the first rollout that needs one: /v1/status
        # then says from the start which limits are in force and how, and a runtime that
        # cannot run here is reported at once (the server still serves what needs none).
        try:
            runtime = await self.sandboxes.get()
        except SandboxError:
            pass  # recorded in sandboxes.status()["error"] and logged
        else:  # the sandboxes' own Python, made now rather than in the first rollout's INIT
            python = getattr(runtime, "python", None)
            if isinstance(python, SandboxPython) and getattr(runtime.config, "share_interpreter", False):
                self._sandbox_python = asyncio.create_task(python.get(), name="rollserve-sandbox-python")
        # Handlers validate instances on the event loop at submit time; import the
        # heavy task libraries (and probe node) now, in a thread, so the first submit
        # does not stall it.
        await asyncio.to_thread(_warm_imports)
        for spec in self.config.backends:
            self.router.add(backend_from_spec(spec))
        await self.router.start()  # health checks
        await self._probe_tokenizer()
        if self.cluster is not None:
            self.cluster.settings.seed_salt = self.context.seed_salt  # the nodes seed as we do
            await self.cluster.start()  # workers on the nodes there are now
        await self.engine.start()

    async def save_weights(self) -> None:
        """Keep the router's weights in force (after a load or a resume) for a restart;
        ``OSError`` if they could not be written."""
        async with self._weights_lock:  # read under it: the last written is the latest
            await asyncio.to_thread(weights_file.write, self.weights_path, self.router.in_force())

    def sandbox_status(self) -> SandboxStatus:
        return SandboxStatus.model_validate({**self.sandboxes.status(), "reaped_at_start": self.reaped})

    def begin_shutdown(self) -> None:
        """The HTTP server is shutting down (a signal): long-polls and event streams end
        now, answering what they have, so it need not wait for them (``stop`` follows)."""
        self.rollouts.begin_shutdown()

    def _judge(self, spec: str | dict[str, Any]) -> Judge:
        """A judge from its spec: a backend of its own, never the router's."""
        config = parse_judge_spec(spec)
        backend = parse_backend_spec(config.backend)
        if backend.name is None:
            backend = backend.model_copy(update={"name": f"judge:{config.name}"})
        return Judge(config, backend_from_spec(backend), self.tokenizer)

    async def stop(self) -> None:
        if self._sandbox_python is not None:
            self._sandbox_python.cancel()  # (a build under way finishes in its thread)
            await asyncio.gather(self._sandbox_python, return_exceptions=True)
        await self.rollouts.aclose()  # (keyed re-scorings still running)
        await self.engine.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.sandboxes.aclose()  # any a rollout's cleanup did not get to
        await self.router.stop()  # health checks off; every backend closed
        await self.judges.close()
        await self.scoring.aclose()
        await self.store.close()
        if self._tokenizer_probe is not None:
            self._tokenizer_probe.cancel()
            await asyncio.gather(self._tokenizer_probe, return_exceptions=True)
        await self.tokenizer.close()  # a backend tokenizer's HTTP session

    async def _probe_tokenizer(self) -> None:
        """A serving backend's tokenizer is probed now if it answers, else again in the
        background until it does (an RL job may start rollserve before its inference
        servers; until then a rollout whose tools need the template's answer is masked)."""
        try:
            await self.tokenizer.ready()  # a local tokenizer: nothing to probe
            # The gateway's bytes-per-token bound walks the whole vocabulary (0.5 s for
            # SmolLM2's): computed (and cached) here, off the loop, not in its first call.
            await asyncio.to_thread(getattr, self.tokenizer, "max_token_bytes", None)
        except RolloutError as exc:  # TokenizerError and LLMError included
            log.warning("tokenizer %s not ready yet (probed again until it answers): %s", self.tokenizer.name, exc)
            self._tokenizer_probe = asyncio.create_task(self._probe_until_ready(), name="rollserve-tokenizer-probe")

    async def _probe_until_ready(self) -> None:
        delay = TOKENIZER_REPROBE_FIRST
        while True:
            await asyncio.sleep(delay)
            try:
                await self.tokenizer.ready()
            except RolloutError as exc:
                log.debug("tokenizer %s still not ready: %s", self.tokenizer.name, exc)
                delay = min(delay * 2, TOKENIZER_REPROBE_MAX)
                continue
            log.info("tokenizer %s is ready", self.tokenizer.name)
            return

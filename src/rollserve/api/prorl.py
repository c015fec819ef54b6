"""ProRL-compatible API: ProRL Agent Server's routes, served by rollserve's engine.

ProRL Agent's clients (NeMo Gym's ``prorl_agent``, ProRL's own trainers) talk to a
small HTTP API on port 8006. ``rollserve serve --prorl`` serves the same routes, with
the same request shapes, result dict and status codes, so those clients work
unchanged while the work runs on rollserve's engine (staged pools, durable store,
load-aware router, exact tokens):

    POST /start                      accept work (400 if already started)
    POST /stop                       stop accepting; jobs in flight are cancelled (409 to them)
    GET  /status                     queue and stage counts (503 before /start)
    POST /cancel {job_id}            cancel the job's rollouts (they answer critical_error "timeout")
    POST /add_llm_server {address}   register a vLLM server ("http://host:8000/v1" or the root;
                                     "sglang=URL" etc. for other kinds)
    POST /clear_llm_server           remove every inference backend
    POST /process {instance, sampling_params, job_id?}
                                     run one rollout and answer ProRL's result dict

/process: ``instance["data_source"]`` (default ``swebench``, as in ProRL) names the
rollserve handler (400 if none is registered); ``sampling_params`` maps temperature,
top_p, top_k, seed, max_output_tokens (or max_tokens / max_completion_tokens /
max_new_tokens) and stop_token_ids to the turn's sampling, ``max_iterations`` to the
agent's turn limit, and ignores the rest (LiteLLM settings such as model and
api_key). 503 before /start or with no LLM server; 504 when the job outlives the wait
(``ProRLConfig.http_timeout``; the rollout is cancelled); 429 when the engine is full.

The result: rollserve's ``RolloutResult`` mapped to ProRL's (``api.prorl_result``);
every shape is a model in ``rollserve.contract.prorl``.

Upstream sources matched (read, not copied):

- NVIDIA-NeMo/ProRL-Agent-Server @ 40c1d8a6b3adb8570f72cd33863502681d5e2b27:
  ``scripts/start_server.py`` (routes, status codes and their ``detail`` texts,
  /status shape, default port 8006), ``openhands/nvidia/utils.py`` (ProcessRequest,
  CancelRequest, LLMServerRequest; the init/run/eval exception dicts and
  ``final_result``'s filter rule), ``openhands/nvidia/async_server.py`` (``process``:
  data_source default, agent-config keys taken out of sampling_params, ``status``
  keys, timing added to the result), ``openhands/nvidia/timer.py`` (timing keys);
  ``openhands/nvidia/registry.py`` @ 02daba33a810b5a0fffec7b3d0581880760f3ec2
  (agent-config keys: max_iterations, ...).
- NVIDIA-NeMo/Gym, the client: ``responses_api_agents/prorl_agent/run_prorl.py`` @
  3ec0939f8377700ce9e160de1bca42ba3bfb91e7 (``initialize_prorl_server``: /start,
  400 = already running, then /add_llm_server with the model's ``.../v1`` URL;
  ``call_prorl_process``; ``convert_prorl_messages_to_output_items``: the message
  fields read), ``app.py`` @ abd28876ff883856c3ee7b6a4de26de7c328238e
  (``_run_with_prorl``: sampling_params sent, result fields read, job_id =
  instance_id, so one job_id may name several concurrent rollouts),
  ``tests/test_run_prorl.py`` @ 003824eddd53582519a37f9376b1b9eaa7130118.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

from rollserve.api.backend_add import add_verified
from rollserve.api.base import service_of
from rollserve.api.errors import error_response, errors, model_response
from rollserve.api.guards import StrictJSONRoute
from rollserve.api.prorl_result import prorl_result
from rollserve.contract import (
    AgentLimits,
    BackendInfo,
    BackendState,
    JSONObject,
    RolloutResult,
    SamplingParams,
    SubmitRequest,
    TaskRequest,
    Timeouts,
)
from rollserve.contract.prorl import (
    CancelRequest,
    LLMServerRequest,
    ProcessRequest,
    ProRLResult,
    ProRLStatus,
    StatusReply,
)
from rollserve.contract.validation import describe
from rollserve.engine.errors import InvalidTask, UnknownDataSource
from rollserve.engine.facade import Rollouts
from rollserve.llm.backends import ServerSpec, VLLMSpec, backend_from_spec, remote_spec
from rollserve.llm.routing import Router, WeightsRefused

log = logging.getLogger(__name__)

DEFAULT_PORT = 8006
NOT_RUNNING = "Server is not running. Please start the server first."
NO_LLM_SERVER = "No LLM server addresses configured. Please add at least one LLM server address."
STOPPED = "Failed to process job: the server was stopped (POST /stop); job cancelled"
# ProRL's own server answers a stopped job with a 500; rollserve never answers 500, so
# it is a 409: the request conflicts with the server's state (stopped), nothing broke.
STOPPED_RESPONSE = error_response(
    409, "ProRL: the server was stopped (POST /stop) while the job ran; the job was cancelled"
)


class ProRLConfig(BaseModel):
    timeout: float | None = Field(
        None,
        gt=0,
        description="seconds one job may take in all (its rollout's total deadline); None: the handler's default",
    )
    http_timeout: float | None = Field(
        None,
        gt=0,
        description="seconds /process waits before a 504 (the job is cancelled); "
        "None: the rollout's deadline plus 30 s",
    )
    default_data_source: str = Field("swebench", description="for instances without one (ProRL's default)")


# --- state ----------------------------------------------------------------------------
class ProRLCompat:
    """What ProRL's server keeps beside the engine: started or not, and its jobs."""

    def __init__(self, config: ProRLConfig | None = None):
        self.config = config or ProRLConfig()
        self.running = False
        self.jobs: dict[str, set[str]] = {}  # job_id -> rollout ids in flight
        self.stopped: set[str] = set()  # rollouts cancelled by /stop (their /process gets a 409)
        self.waiting = 0  # /process calls waiting for their result

    def track(self, job_id: str, rollout_id: str) -> None:
        self.jobs.setdefault(job_id, set()).add(rollout_id)

    def untrack(self, job_id: str, rollout_id: str) -> None:
        ids = self.jobs.get(job_id)
        if ids is not None:
            ids.discard(rollout_id)
            if not ids:
                del self.jobs[job_id]
        self.stopped.discard(rollout_id)


router = APIRouter(tags=["prorl"], route_class=StrictJSONRoute)


def _compat(request: Request) -> ProRLCompat:
    compat: ProRLCompat = request.app.state.prorl
    return compat


def _rollouts(request: Request) -> Rollouts:
    return service_of(request).rollouts


def _router(request: Request) -> Router:
    return service_of(request).router


def _backends(llm_router: Router) -> list[BackendState]:
    return [BackendState.model_validate(b) for b in llm_router.list()]


def _require_running(compat: ProRLCompat) -> None:
    if not compat.running:
        raise HTTPException(503, NOT_RUNNING)


@router.post("/start", response_model=StatusReply, responses=errors(400))
async def start(request: Request) -> StatusReply:
    compat = _compat(request)
    if compat.running:
        raise HTTPException(400, "Server is already running")
    compat.running = True
    return StatusReply(status="Server started successfully")


@router.post("/stop", response_model=StatusReply, responses=errors(503))
async def stop(request: Request) -> StatusReply:
    compat = _compat(request)
    _require_running(compat)
    compat.running = False
    rollouts = _rollouts(request)
    for rollout_ids in compat.jobs.values():
        for rollout_id in rollout_ids:
            compat.stopped.add(rollout_id)
            rollouts.stop(rollout_id)
    return StatusReply(status="Server stopped successfully")


@router.get("/status", response_model=ProRLStatus, responses=errors(503))
async def status(request: Request) -> ProRLStatus:
    compat = _compat(request)
    _require_running(compat)
    stages = _rollouts(request).status().stages
    init, run, evaluate = stages["init"], stages["run"], stages["eval"]
    counts = {
        "init_queue": init.queued,
        "run_queue": run.queued,
        "eval_queue": evaluate.queued,
        "active_init": init.busy,
        "active_run": run.busy,
        "active_eval": evaluate.busy,
    }
    return ProRLStatus(
        status="running",
        pending_jobs=compat.waiting,
        **counts,
        total=sum(counts.values()),
        llm_servers=[b.url or b.name for b in _backends(_router(request))],
    )


@router.post("/cancel", response_model=StatusReply, responses=errors(503))
async def cancel(body: CancelRequest, request: Request) -> StatusReply:
    compat = _compat(request)
    _require_running(compat)
    rollouts = _rollouts(request)
    for rollout_id in list(compat.jobs.get(body.job_id, ())):
        rollouts.stop(rollout_id)
    return StatusReply(status=f"Cancel requested for job {body.job_id}")


def backend_spec_for_address(address: str) -> ServerSpec:
    """ProRL registers OpenAI-style base URLs (``http://host:8000/v1``); rollserve talks
    to the server's root. ``KIND=URL`` picks another kind of server; an embedded
    backend (a model file on the server's disk) is refused, as over rollserve's API."""
    text = address.strip()
    if "=" in text.split("://", 1)[0]:
        spec = remote_spec(text)
    else:
        spec = VLLMSpec(url=text)
    url = spec.url.rstrip("/").removesuffix("/v1")
    return spec.model_copy(update={"url": url})


@router.post("/add_llm_server", response_model=StatusReply, responses=errors(400))
async def add_llm_server(body: LLMServerRequest, request: Request) -> StatusReply:
    compat = _compat(request)
    llm_router = _router(request)
    try:
        spec = backend_spec_for_address(body.address)
        backend = backend_from_spec(spec)
    except (ValueError, ValidationError) as exc:
        raise HTTPException(400, f"Failed to add LLM server: {exc}") from exc
    registered = _backends(llm_router)
    known = {b.url for b in registered if b.url} | {b.name for b in registered}
    info = BackendInfo.model_validate(backend.describe())
    if info.url in known or info.name in known:
        log.warning("LLM server address %s already exists", body.address)
        await backend.close()
    else:
        try:  # after a LoRA load, it names the adapter; refused if it cannot serve one
            await add_verified(llm_router, backend, spec.model_dump_json())
        except WeightsRefused as exc:
            await backend.close()
            raise HTTPException(400, f"Failed to add LLM server: {exc}") from exc
    verb = "Added" if compat.running else "Buffered"
    return StatusReply(status=f"{verb} LLM server address: {body.address}")


@router.post("/clear_llm_server", response_model=StatusReply)
async def clear_llm_server(request: Request) -> StatusReply:
    compat = _compat(request)
    llm_router = _router(request)
    for backend in llm_router.list():
        await llm_router.remove(backend["name"])  # calls in flight retry on what is added next
    if not compat.running:
        return StatusReply(status="Cleared buffered LLM server addresses")
    return StatusReply(status="Cleared all LLM server addresses")


# --- /process ---------------------------------------------------------------------------
_MAX_TOKENS_KEYS = ("max_output_tokens", "max_tokens", "max_completion_tokens", "max_new_tokens")
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed", "stop_token_ids")


def sampling_from_params(params: JSONObject) -> tuple[SamplingParams, AgentLimits]:
    """ProRL's sampling_params (LiteLLM settings + agent config) as rollserve's.

    Raises ``ValueError`` naming the field at fault."""
    sampling: JSONObject = {k: params[k] for k in _SAMPLING_KEYS if params.get(k) is not None}
    for key in _MAX_TOKENS_KEYS:
        if params.get(key) is not None:
            sampling["max_tokens"] = params[key]
            break
    agent: JSONObject = {}
    if params.get("max_iterations") is not None:
        agent["max_turns"] = params["max_iterations"]
    try:
        return SamplingParams.model_validate(sampling), AgentLimits.model_validate(agent)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        field = {"max_tokens": "max_output_tokens", "max_turns": "max_iterations"}.get(field, field)
        raise ValueError(f"sampling_params.{field}: {first.get('msg', 'invalid')}") from exc


def _task(body: ProcessRequest, job_id: str, compat: ProRLCompat, rollouts: Rollouts) -> TaskRequest:
    """The task a /process body asks for: a 400 names what in it is invalid."""
    instance = body.instance
    data_source = instance.get("data_source") or compat.config.default_data_source
    if not isinstance(data_source, str):
        raise HTTPException(400, f"Invalid instance data: data_source must be a string, got {data_source!r}")
    try:
        rollouts.check_data_source(data_source)
    except UnknownDataSource as exc:
        raise HTTPException(400, f"Invalid dataset type or function not registered: {exc.message}") from exc
    try:
        sampling, agent = sampling_from_params(body.sampling_params)
    except ValueError as exc:
        raise HTTPException(400, f"Invalid sampling_params: {exc}") from exc
    try:
        return TaskRequest(
            data_source=data_source,
            instance=instance,
            sampling=sampling,
            agent=agent,
            timeouts=Timeouts(total=compat.config.timeout),
            metadata={"prorl_job_id": job_id},
        )
    except ValidationError as exc:
        raise HTTPException(400, f"Invalid instance data: {describe(exc)}") from exc


async def _wait_result(rollout_id: str, compat: ProRLCompat, rollouts: Rollouts) -> RolloutResult:
    """The rollout's result, waited for up to its deadline (plus a margin) or the
    configured HTTP timeout: a 503 when a shutdown ends the wait, a 504 (the rollout
    stopped) when the time runs out, a 409 when /stop cancelled it."""
    deadline = rollouts.total_timeout(rollout_id)
    if deadline is None:
        deadline = compat.config.timeout
    wait = compat.config.http_timeout or ((deadline or 1800.0) + 30.0)
    await rollouts.wait([rollout_id], wait)
    result = await rollouts.finished(rollout_id)
    if result is None and rollouts.closing:  # the wait ended early: a shutdown
        raise HTTPException(503, "the server is shutting down; the job did not finish")
    if result is None:
        rollouts.stop(rollout_id)
        raise HTTPException(504, "Processing timed out")
    if rollout_id in compat.stopped and result.status == "cancelled":
        raise HTTPException(409, STOPPED)
    return result


@router.post("/process", response_model=ProRLResult, responses={**errors(400, 429, 503, 504), 409: STOPPED_RESPONSE})
async def process(body: ProcessRequest, request: Request) -> Response:
    compat = _compat(request)
    rollouts = _rollouts(request)
    _require_running(compat)
    if not _router(request).list():
        raise HTTPException(503, NO_LLM_SERVER)
    instance = body.instance
    job_id = body.job_id or str(uuid.uuid4())
    task = _task(body, job_id, compat, rollouts)
    try:
        (accepted,) = await rollouts.submit(SubmitRequest(tasks=[task]))
    except InvalidTask as exc:  # QueueFull goes on: a 429, as everywhere
        where = str(exc).replace("tasks[0].", "", 1)
        raise HTTPException(400, f"Invalid instance data: {where}") from exc
    (rollout_id,) = accepted.rollout_ids
    compat.track(job_id, rollout_id)
    compat.waiting += 1
    try:
        result = await _wait_result(rollout_id, compat, rollouts)
        # Rendered without unset fields: messages carry only the keys ProRL's do.
        # Mapped on a worker thread: each assistant message carries its whole prompt's ids.
        answer = await asyncio.to_thread(prorl_result, result, instance, job_id)
        return await model_response(answer, exclude_unset=True)
    except asyncio.CancelledError:
        rollouts.stop(rollout_id)  # the client is gone: stop spending on it
        raise
    finally:
        compat.waiting -= 1
        compat.untrack(job_id, rollout_id)

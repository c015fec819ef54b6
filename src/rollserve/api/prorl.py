"""ProRL-compatible API: ProRL Agent Server's routes, served by rollserve's engine.

ProRL Agent's clients (NeMo Gym's ``prorl_agent``, ProRL's own trainers) talk to a
small HTTP API on port 8006. ``rollserve serve --prorl`` serves the same routes, with
the same request shapes, result dict and status codes, so those clients work
unchanged while the work runs on rollserve's engine (staged pools, durable store,
load-aware router, exact tokens):

    POST /start                      accept work (400 if already started)
    POST /stop                       stop accepting; jobs in flight are cancelled (500 to them)
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

The result, from rollserve's own result (``Rollout.result()``):

- ``messages``: the chat view, up to the last assistant message (as ProRL's); every
  assistant message carries ``token_ids`` (the ids the policy sampled, verbatim),
  ``logprobs`` and ``input_ids`` (that turn's whole prompt: every earlier prompt delta
  and sampled id), plus ``tool_calls`` flattened to ``{"name", "arguments"}`` when the
  reply called tools (Hermes blocks, or a chat API's calls). ``None`` for the three on
  a message-level (not trainable) backend, as ProRL without token-level generation.
- ``critical_error``: ``timeout`` for a timed-out or cancelled rollout; the stage
  (``init`` | ``run`` | ``eval``) of an infrastructure failure; ``None`` otherwise
  (the agent's own failures are trained on, as ProRL's ``AgentToolCallError``).
- ``filter``: rollserve's ``mask`` (or any critical_error): do not train on it.
- ``resolved``: the evaluation's ``resolved`` if it has one, else reward >= 1;
  ``success``: the rollout completed without failure; ``finish``: the agent ended the
  episode itself; ``end_properly``: its last turn was not cut by max_tokens or the
  context limit; ``git_patch``: the evaluation's, if any; ``error``: the failure
  message; ``tools``: the tool schemas the agent was shown (ChatCompletion format).
- ``timing``: ProRL's keys (init_time, run_time, eval_time, others_time,
  counted_elapsed, timeout_triggered) from rollserve's timing.
- Added: ``instance_id``, ``trajectory_id`` (from the instance, as ProRL), and
  rollserve's ``rollout_id``, ``reward`` and ``mask_reason``.

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
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

from rollserve.agent.loop import AgentLimits
from rollserve.agent.tool_calls import parse_tool_calls
from rollserve.api.errors import errors, json_response
from rollserve.api.guards import StrictJSONRoute
from rollserve.engine.requests import SubmitRequest, TaskRequest
from rollserve.engine.rollout import TERMINAL, Timeouts
from rollserve.engine.submit import SubmitError, submit
from rollserve.handlers.registry import UnknownDataSource
from rollserve.llm.base import SamplingParams
from rollserve.validation import describe
from rollserve.llm.backends.factory import BackendSpec, backend_from_spec, remote_spec

log = logging.getLogger(__name__)

DEFAULT_PORT = 8006
NOT_RUNNING = "Server is not running. Please start the server first."
NO_LLM_SERVER = "No LLM server addresses configured. Please add at least one LLM server address."
STOPPED = "Failed to process job: RuntimeError: Server is stopping; job cancelled"


class ProRLConfig(BaseModel):
    timeout: float | None = Field(
        None, gt=0, description="seconds one job may take in all (its rollout's total "
        "deadline); None: the handler's default")
    http_timeout: float | None = Field(
        None, gt=0, description="seconds /process waits before a 504 (the job is cancelled); "
        "None: the rollout's deadline plus 30 s")
    default_data_source: str = Field("swebench", description="for instances without one (ProRL's default)")


# --- request bodies (ProRL's, field for field) -------------------------------------------
class ProcessRequest(BaseModel):
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    job_id: str | None = None


class CancelRequest(BaseModel):
    job_id: str


class LLMServerRequest(BaseModel):
    address: str


# --- state ----------------------------------------------------------------------------
class ProRLCompat:
    """What ProRL's server keeps beside the engine: started or not, and its jobs."""

    def __init__(self, config: ProRLConfig | None = None):
        self.config = config or ProRLConfig()
        self.running = False
        self.jobs: dict[str, set[str]] = {}  # job_id -> rollout ids in flight
        self.stopped: set[str] = set()  # rollouts cancelled by /stop (their /process gets a 500)
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
    return request.app.state.prorl


def _service(request: Request):
    return request.app.state.service


def _require_running(compat: ProRLCompat) -> None:
    if not compat.running:
        raise HTTPException(503, NOT_RUNNING)


@router.post("/start", responses=errors(400))
async def start(request: Request) -> dict:
    compat = _compat(request)
    if compat.running:
        raise HTTPException(400, "Server is already running")
    compat.running = True
    return {"status": "Server started successfully"}


@router.post("/stop", responses=errors(503))
async def stop(request: Request) -> dict:
    compat = _compat(request)
    _require_running(compat)
    compat.running = False
    engine = _service(request).engine
    for rollout_ids in compat.jobs.values():
        for rollout_id in rollout_ids:
            compat.stopped.add(rollout_id)
            engine.cancel(rollout_id)
    return {"status": "Server stopped successfully"}


@router.get("/status", responses=errors(503))
async def status(request: Request) -> dict:
    compat = _compat(request)
    _require_running(compat)
    service = _service(request)
    counts: dict[str, int] = {}
    for stage, pool in service.engine.pools.items():
        snap = pool.snapshot()
        counts[f"{stage}_queue"] = snap["queued"]
        counts[f"active_{stage}"] = snap["busy"]
    ordered = {key: counts[key] for key in ("init_queue", "run_queue", "eval_queue",
                                             "active_init", "active_run", "active_eval")}
    return {"status": "running", "pending_jobs": compat.waiting, **ordered,
            "total": sum(ordered.values()),
            "llm_servers": [b.get("url") or b["name"] for b in service.router.list()]}


@router.post("/cancel", responses=errors(503))
async def cancel(body: CancelRequest, request: Request) -> dict:
    compat = _compat(request)
    _require_running(compat)
    engine = _service(request).engine
    for rollout_id in list(compat.jobs.get(body.job_id, ())):
        engine.cancel(rollout_id)
    return {"status": f"Cancel requested for job {body.job_id}"}


def backend_spec_for_address(address: str) -> BackendSpec:
    """ProRL registers OpenAI-style base URLs (``http://host:8000/v1``); rollserve talks
    to the server's root. ``KIND=URL`` picks another kind of server; an embedded
    backend (a model file on the server's disk) is refused, as over rollserve's API."""
    text = address.strip()
    if "=" in text.split("://", 1)[0]:
        spec = remote_spec(text)
    else:
        spec = BackendSpec(kind="vllm", url=text)
    url = (spec.url or "").rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return spec.model_copy(update={"url": url or None})


@router.post("/add_llm_server", responses=errors(400))
async def add_llm_server(body: LLMServerRequest, request: Request) -> dict:
    compat = _compat(request)
    llm_router = _service(request).router
    try:
        spec = backend_spec_for_address(body.address)
        backend = backend_from_spec(spec)
    except (ValueError, ValidationError) as exc:
        raise HTTPException(400, f"Failed to add LLM server: {exc}") from exc
    known = {b.get("url") for b in llm_router.list()} | {b["name"] for b in llm_router.list()}
    if getattr(backend, "url", None) in known or backend.name in known:
        log.warning("LLM server address %s already exists", body.address)
        await backend.close()
    else:
        llm_router.add(backend)
    verb = "Added" if compat.running else "Buffered"
    return {"status": f"{verb} LLM server address: {body.address}"}


@router.post("/clear_llm_server")
async def clear_llm_server(request: Request) -> dict:
    compat = _compat(request)
    llm_router = _service(request).router
    for backend in llm_router.list():
        await llm_router.remove(backend["name"])  # calls in flight retry on what is added next
    if not compat.running:
        return {"status": "Cleared buffered LLM server addresses"}
    return {"status": "Cleared all LLM server addresses"}


# --- /process ---------------------------------------------------------------------------
_MAX_TOKENS_KEYS = ("max_output_tokens", "max_tokens", "max_completion_tokens", "max_new_tokens")
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed", "stop_token_ids")


def sampling_from_params(params: dict[str, Any]) -> tuple[SamplingParams, AgentLimits]:
    """ProRL's sampling_params (LiteLLM settings + agent config) as rollserve's.

    Raises ``ValueError`` naming the field at fault."""
    sampling: dict[str, Any] = {k: params[k] for k in _SAMPLING_KEYS if params.get(k) is not None}
    for key in _MAX_TOKENS_KEYS:
        if params.get(key) is not None:
            sampling["max_tokens"] = params[key]
            break
    agent: dict[str, Any] = {}
    if params.get("max_iterations") is not None:
        agent["max_turns"] = params["max_iterations"]
    try:
        return SamplingParams(**sampling), AgentLimits(**agent)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        field = {"max_tokens": "max_output_tokens", "max_turns": "max_iterations"}.get(field, field)
        raise ValueError(f"sampling_params.{field}: {first.get('msg', 'invalid')}") from exc


@router.post("/process", responses=errors(400, 429, 500, 503, 504))
async def process(body: ProcessRequest, request: Request) -> Response:
    compat = _compat(request)
    service = _service(request)
    _require_running(compat)
    if not service.router.list():
        raise HTTPException(503, NO_LLM_SERVER)
    instance = body.instance
    data_source = instance.get("data_source") or compat.config.default_data_source
    if not isinstance(data_source, str):
        raise HTTPException(400, f"Invalid instance data: data_source must be a string, got {data_source!r}")
    try:
        service.engine.handler(data_source)
    except UnknownDataSource as exc:
        raise HTTPException(400, "Invalid dataset type or function not registered: "
                                 f"{str(exc).strip(chr(34) + chr(39))}") from exc
    try:
        sampling, agent = sampling_from_params(body.sampling_params)
    except ValueError as exc:
        raise HTTPException(400, f"Invalid sampling_params: {exc}") from exc
    job_id = body.job_id or str(uuid.uuid4())
    try:
        task = TaskRequest(data_source=data_source, instance=instance, sampling=sampling,
                           agent=agent, timeouts=Timeouts(total=compat.config.timeout),
                           metadata={"prorl_job_id": job_id})
    except ValidationError as exc:
        raise HTTPException(400, f"Invalid instance data: {describe(exc)}") from exc
    try:
        (accepted,) = await submit(service.engine, SubmitRequest(tasks=[task]),
                                   request.app.state.limits)
    except SubmitError as exc:
        where = str(exc).replace("tasks[0].", "", 1)
        raise HTTPException(400, f"Invalid instance data: {where}") from exc
    (rollout_id,) = accepted.rollout_ids
    compat.track(job_id, rollout_id)
    compat.waiting += 1
    try:
        live = service.engine.live.get(rollout_id)
        deadline = live.timeouts.total if live is not None else compat.config.timeout
        wait = compat.config.http_timeout or ((deadline or 1800.0) + 30.0)
        await service.engine.wait_finished([rollout_id], wait)
        row = await service.store.rollout(rollout_id)
        if row is None or row.status not in TERMINAL:
            service.engine.cancel(rollout_id)
            raise HTTPException(504, "Processing timed out")
        if rollout_id in compat.stopped:
            raise HTTPException(500, STOPPED)
        return await json_response(prorl_result(row.result, instance, job_id))
    except asyncio.CancelledError:
        service.engine.cancel(rollout_id)  # the client is gone: stop spending on it
        raise
    finally:
        compat.waiting -= 1
        compat.untrack(job_id, rollout_id)


# --- our result -> ProRL's ----------------------------------------------------------------
def prorl_result(result: dict, instance: dict, job_id: str | None = None) -> dict:
    """rollserve's result dict as ProRL's ``/process`` answers it (see the module doc)."""
    traj = result.get("trajectory") or {}
    failure = result.get("failure")
    evaluation = result.get("evaluation") or {}
    status = result.get("status")
    reward = result.get("reward")
    if status in ("timed_out", "cancelled"):
        critical_error = "timeout"
    elif failure is not None and failure.get("kind") != "agent":
        stage = failure.get("stage")
        critical_error = stage if stage in ("init", "run", "eval") else "init"
    else:
        critical_error = None
    turns = traj.get("turns") or []
    last_turn = turns[-1] if turns else None
    resolved = evaluation.get("resolved")
    if not isinstance(resolved, bool):
        resolved = reward is not None and reward >= 1.0
    git_patch = evaluation.get("git_patch")
    return {
        "instance_id": instance.get("instance_id"),
        "trajectory_id": instance.get("trajectory_id"),
        "job_id": job_id,
        "git_patch": git_patch if isinstance(git_patch, str) else None,
        "success": status == "completed" and failure is None,
        "finish": traj.get("ended_by") == "finished",
        "messages": prorl_messages(traj),
        "tools": traj.get("tools") or [],
        "end_properly": traj.get("ended_by") != "context_exhausted"
        and not (last_turn and last_turn.get("finish_reason") == "length"),
        "resolved": bool(resolved) and critical_error is None,
        "critical_error": critical_error,
        "filter": bool(result.get("mask")) or critical_error is not None,
        "error": failure.get("message") if failure else None,
        "timing": prorl_timing(result.get("timing") or {}, status),
        "rollout_id": result.get("id"),
        "reward": reward,
        "mask_reason": result.get("mask_reason"),
    }


def prorl_timing(timing: dict, status: str | None) -> dict:
    init, run, evaluate = (float(timing.get(k, 0.0)) for k in ("init", "run", "eval"))
    counted = init + run + evaluate
    return {
        "init_time": init,
        "run_time": run,
        "eval_time": evaluate,
        "others_time": max(0.0, float(timing.get("total", counted)) - counted),
        "counted_elapsed": counted,
        "timeout_triggered": status == "timed_out",
    }


def prorl_messages(traj: dict) -> list[dict]:
    """The chat view with each assistant message's ids: ``token_ids`` (sampled),
    ``logprobs``, and ``input_ids`` (the prompt that turn was sampled from)."""
    messages = traj.get("messages") or []
    turns = traj.get("turns") or []
    trainable = traj.get("trainable", True)
    prompts: list[list[int]] = []
    sequence: list[int] = []
    for turn in turns:
        sequence = sequence + list(turn.get("prompt_ids_delta") or [])
        prompts.append(sequence)
        sequence = sequence + list(turn.get("output_ids") or [])
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    # ProRL's conversations end with the last assistant message (none: no messages).
    messages = messages[: assistant_at[-1] + 1] if assistant_at else []
    # The loop appends one assistant message per turn, after any the task opened with.
    first_turn_message = len(assistant_at) - len(turns)
    out = []
    for index, message in enumerate(messages):
        item: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None:
                item[key] = message[key]
        if item["role"] == "assistant":
            calls = _flat_tool_calls(message)
            if calls:
                item["tool_calls"] = calls
            turn_index = assistant_at.index(index) - first_turn_message
            if trainable and 0 <= turn_index < len(turns):
                turn = turns[turn_index]
                item["token_ids"] = list(turn.get("output_ids") or [])
                item["input_ids"] = prompts[turn_index]
                item["logprobs"] = list(turn.get("logprobs") or [])
            else:
                item["token_ids"] = item["input_ids"] = item["logprobs"] = None
        out.append(item)
    return out


def _flat_tool_calls(message: dict) -> list[dict]:
    """ProRL's flattened tool calls: ``[{"name", "arguments"}]``."""
    native = message.get("tool_calls")
    if native:  # a chat API's structured calls
        return [{"name": (c.get("function") or c).get("name", ""),
                 "arguments": (c.get("function") or c).get("arguments", "")} for c in native]
    content = message.get("content")
    if not isinstance(content, str):
        return []
    return [{"name": call.name, "arguments": call.arguments}
            for call in parse_tool_calls(content).calls]

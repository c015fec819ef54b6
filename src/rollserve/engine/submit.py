"""Admission: validate a whole batch, store it in one transaction, then start it.

Nothing is half-done: a batch with one bad task is refused whole (naming the
field), a batch that can never fit (more rollouts than ``max_pending``) is refused
with the limit, and a batch that does not fit now is refused whole with a retry hint.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from rollserve.contract import Accepted, SamplingParams, SubmitRequest, TaskRequest
from rollserve.contract.judge import JudgeRequest
from rollserve.engine.errors import (
    BatchTooLarge,
    Conflict,
    InvalidTask,
    QueueFull,
    UnknownDataSource,
)
from rollserve.engine.pipeline import Engine
from rollserve.engine.requests import RequestLimits, json_size, merged, request_hash
from rollserve.engine.rollout import RolloutSpec
from rollserve.engine.store import DuplicateClientKey, GroupRow
from rollserve.handlers import UnknownDataSource as UnknownHandler
from rollserve.handlers.base import AgentHandler, InvalidInstance

log = logging.getLogger(__name__)


def sample_seeded(sampling: SamplingParams, index: int) -> SamplingParams:
    """A group's sample ``index`` samples with ``seed + index``: one seed for all n
    samples would give n identical samples (no reward spread, nothing to learn). The
    batch stays reproducible; sample 0 keeps the seed as given."""
    if sampling.seed is None or index == 0:
        return sampling
    return sampling.model_copy(update={"seed": (sampling.seed + index) % 2**63})


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(8)}"


# Room a rollout's window must leave beyond a harness's measured first prompt: the
# task's own text (the measure used a one-line task) and the first reply.
FIRST_PROMPT_MARGIN = 256


def _backend_window(engine: Engine) -> int | None:
    """The smallest context window among the router's usable token-level backends, where
    any reports one (a server's is read at its health checks; None before)."""
    session = engine.router.session("rollserve-submit-window")
    if session is None:
        return None
    try:
        return session.context_window()
    finally:
        session.close()


def _check_window(engine: Engine, handler: AgentHandler, task: TaskRequest, request: SubmitRequest, where: str) -> None:
    """A rollout whose context window cannot hold its harness's first prompt (the
    preset's measured size, ``AgentHandler.first_prompt``) and a margin is refused now,
    naming both numbers, not failed at its first call."""
    # (a handler that does not derive from AgentHandler, a plugin's or a test's, has no
    # harness to measure)
    measure = getattr(handler, "first_prompt", None)
    first = measure(task.instance) if measure is not None else None
    if first is None:
        return
    asked = merged(request.agent, task.agent).max_context_tokens
    limit = asked or handler.defaults.max_context_tokens
    window = _backend_window(engine)
    room, said = (
        limit,
        (
            f"this rollout's max_context_tokens is {limit:,}"
            if asked
            else f"this rollout's max_context_tokens is the {handler.name} family's default, {limit:,}"
        ),
    )
    if window is not None and window < limit:
        room, said = window, f"the policy's context window is {window:,} (the backend's)"
    if first.tokens + FIRST_PROMPT_MARGIN <= room:
        return
    counted = f" ({first.measured})" if first.measured else ""
    raise InvalidTask(
        f"{where}.{first.field}",
        f"{first.what} is ~{first.tokens:,} tokens"
        f"{counted}; {said}: it needs at least {first.tokens + FIRST_PROMPT_MARGIN:,} "
        f"(the prompt and {FIRST_PROMPT_MARGIN} for the task and a reply). Raise "
        "agent.max_context_tokens (and the backend's window) or pick a harness "
        "with a smaller prompt",
    )


def _check_task(engine: Engine, task: TaskRequest, request: SubmitRequest, where: str, limits: RequestLimits) -> None:
    """The task's data source exists, its instance fits the size limit, its handler and
    the rollout's context window."""
    try:
        handler = engine.handler(task.data_source)
    except UnknownHandler as exc:
        raise UnknownDataSource(f"{where}.data_source", exc.message) from exc
    for name, value in (("instance", task.instance), ("metadata", task.metadata)):
        size = json_size(value)
        if size > limits.max_instance_bytes:
            raise InvalidTask(
                f"{where}.{name}",
                f"{size} bytes of JSON; at most {limits.max_instance_bytes} (the server's --max-instance-mb)",
            )
    try:
        handler.validate(task.instance)
    except InvalidInstance as exc:
        field = exc.field if exc.field.startswith("instance") else f"instance.{exc.field}"
        raise InvalidTask(f"{where}.{field}", exc.message) from exc
    except Exception as exc:  # a handler that did not expect this shape: still bad input
        log.warning("the %s handler failed on an instance it was asked to check", task.data_source, exc_info=True)
        raise InvalidTask(
            f"{where}.instance",
            f"the {task.data_source} handler cannot read this instance ({type(exc).__name__}: {exc})",
        ) from exc
    _check_window(engine, handler, task, request, where)
    outside = None if engine.executor.nodes() is None else handler.outside_harness(task.instance)
    if outside is not None:
        raise InvalidTask(
            f"{where}.{outside}",
            "required with --ray: a rollout runs on a "
            "cluster node, whose gateway sessions this server's /v1/gateway "
            "routes cannot reach; run the harness inside the sandbox",
        )


def _check_judge(engine: Engine, judge: JudgeRequest | None, where: str) -> None:
    """A judge reward the server can give: its rubric is known, its judges are."""
    if judge is None:
        return
    problem = engine.context.judge_problem(judge)
    if problem is not None:
        field, message = problem
        raise InvalidTask(f"{where}.{field}", message)


ADMIT_ATTEMPTS = 3  # a store shared with another process: its insert can win between ours


async def submit(engine: Engine, request: SubmitRequest, limits: RequestLimits | None = None) -> list[Accepted]:
    """Admit ``request`` whole (one ``Accepted`` per task, in order) or refuse it whole:
    ``InvalidTask`` (and its kinds) naming the field, ``QueueFull`` with a retry hint.

    A task whose client ``id`` is already stored with the same fingerprint is answered
    as that group (``duplicate``), however many identical submits race: the key lookups
    and the insert are one critical section (``engine.admission``), so the first
    admits and every other finds its group."""
    limits = limits or RequestLimits()
    checked: list[tuple[int, TaskRequest, str]] = []  # (index, task, fingerprint)
    seen_keys: dict[str, int] = {}
    for index, task in enumerate(request.tasks):
        where = f"tasks[{index}]"
        _check_task(engine, task, request, where, limits)
        # (the server's default judge, for a task that names none, was checked once at
        # start: Service refuses to start with a default it cannot give)
        _check_judge(engine, task.judge or request.judge, f"{where}.judge" if task.judge is not None else "judge")
        if task.id is not None:
            if task.id in seen_keys:
                raise InvalidTask(f"{where}.id", f"duplicates tasks[{seen_keys[task.id]}].id in this batch")
            seen_keys[task.id] = index
        # Only a client key is ever looked up, so only a keyed task's fingerprint is
        # compared (``_admit``); a task without one stores none.
        checked.append((index, task, request_hash(task, request) if task.id is not None else ""))
    attempt = 1
    while True:
        try:
            async with engine.admission:
                return await _admit(engine, request, checked)
        except DuplicateClientKey as exc:
            # Only a writer outside this engine gets here (the lock orders ours): look
            # the keys up again, where the one it took now answers as a duplicate.
            if attempt == ADMIT_ATTEMPTS:
                raise Conflict(
                    "tasks[].id", f"id {exc} was taken by a concurrent request and could not be read back"
                ) from exc
            attempt += 1


async def _admit(engine: Engine, request: SubmitRequest, checked: list[tuple[int, TaskRequest, str]]) -> list[Accepted]:
    """Look up the client ids, then store and launch the new groups (under the
    admission lock). Raises ``DuplicateClientKey`` when another writer of the store
    took an id since the lookup."""
    accepted: list[Accepted | None] = [None] * len(request.tasks)
    new: list[tuple[int, TaskRequest, str]] = []
    for index, task, fingerprint in checked:
        if task.id is not None:
            existing = await engine.store.group_by_client_key(task.id)
            if existing is not None:
                if existing.request_hash != fingerprint:
                    raise Conflict(f"tasks[{index}].id", f"id {task.id!r} was already used for a different task")
                found = await engine.store.group(existing.id, results=False)
                rollout_ids = [row.id for row in found[1]] if found else []
                accepted[index] = Accepted(
                    group_id=existing.id, task_id=existing.task_id, rollout_ids=rollout_ids, duplicate=True
                )
                continue
        new.append((index, task, fingerprint))

    # Counted before anything is built: a batch of 10,000 tasks x 1,024 samples is
    # refused without making ten million rollout specs first.
    wanted = sum(task.n + task.oversample for _, task, _ in new)
    if wanted > engine.config.max_pending:
        raise BatchTooLarge(wanted, engine.config.max_pending)
    if wanted > engine.room():
        raise QueueFull(wanted, engine.room(), engine.config.max_pending, engine.retry_after())
    new_groups: list[tuple[GroupRow, list[RolloutSpec]]] = []
    built = 0
    for index, task, fingerprint in new:
        new_groups.append(_group(engine, request, task, fingerprint))
        group, specs = new_groups[-1]
        accepted[index] = Accepted(group_id=group.id, task_id=group.task_id, rollout_ids=[s.id for s in specs])
        built = await _pass_on(built, len(specs))

    if new_groups:
        engine.reserved += wanted  # held across the store write: room() counts it
        try:
            await engine.store.create_groups(new_groups)
        finally:
            engine.reserved -= wanted
    launched = 0
    for _, specs in new_groups:
        engine.launch(specs)
        launched = await _pass_on(launched, len(specs))
    return [a for a in accepted if a is not None]


# Rollouts built (or launched) between two passes of the event loop: a batch of 1,000
# tasks x 4 is 4,000 specs, too long a stretch to hold the loop in one go.
ROLLOUTS_PER_PASS = 500


async def _pass_on(done: int, more: int) -> int:
    """Count ``more`` rollouts done; past ``ROLLOUTS_PER_PASS`` since the last pass, let
    the loop run a pass (answer other requests) and start counting again."""
    done += more
    if done < ROLLOUTS_PER_PASS:
        return done
    await asyncio.sleep(0)
    return 0


def _group(
    engine: Engine, request: SubmitRequest, task: TaskRequest, fingerprint: str
) -> tuple[GroupRow, list[RolloutSpec]]:
    """A new group's row and its rollouts' specs (each sample seeded on its own)."""
    group_id = _new_id("g-")
    task_id = task.id or group_id
    group = GroupRow(group_id, task_id, task.id, fingerprint, task.n, time.time())
    sampling = merged(request.sampling, task.sampling)
    agent = merged(request.agent, task.agent)
    timeouts = merged(request.timeouts, task.timeouts)
    judge = task.judge or request.judge or engine.context.default_judge
    # Built from models the request's validation made (and the server's judge): each
    # field is already what RolloutSpec declares, so none is validated again.
    specs = [
        RolloutSpec.model_construct(
            id=f"{group_id}-{i}",
            group_id=group_id,
            task_id=task_id,
            data_source=task.data_source,
            sample_index=i,
            instance=dict(task.instance),  # (each sample its own, as validation made it)
            sampling=sample_seeded(sampling, i),
            agent=agent,
            timeouts=timeouts,
            metadata=dict(task.metadata),
            judge=judge,
            group_n=task.n,
            oversample=task.oversample,
            filter_zero_variance=task.filter_zero_variance,
        )
        for i in range(task.n + task.oversample)
    ]
    return group, specs

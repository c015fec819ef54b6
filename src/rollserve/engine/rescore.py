"""Re-scoring: EVAL again on stored results with another evaluator configuration (a
new rubric, a fixed grader), without sampling. Each stored result is read with its
stored spec; its family's ``restore`` (by default ``init``) then ``evaluate`` run on a
rollout that holds the stored messages and, for a family that scores what its evaluation
kept (swe: the candidate patch), that evaluation (the family must say it can:
``AgentHandler.rescore_problem``, ``rescore_result_problem``); the
new result is written beside the old one, as a new rollout of a new group (one per
re-scored group), with a new id and its own place in the results cursor. The old
result is left as it was. Nothing reaches the policy's backends.

``Rescores`` makes a re-scoring under an ``idempotency_key`` safe to retry: it runs
once, as a task of its own (a client that gave up waiting does not end it), its
answer kept in the store under the key; the same request again joins the run or gets
the kept answer, a different one under the key is a ``Conflict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid

from rollserve.agent import Trajectory
from rollserve.contract import MAX_WAIT, Failure, FailureStage, RolloutResult
from rollserve.contract.judge import JudgeRequest, Rescored, RescoreRequest, RescoreResponse
from rollserve.engine.config import new_rollout
from rollserve.engine.errors import Conflict, InvalidTask, NotFound, StillRunning
from rollserve.engine.pipeline import CLEANUP_TIMEOUT, Engine
from rollserve.engine.priority import background_context
from rollserve.engine.requests import rescore_hash
from rollserve.engine.rollout import RolloutSpec, plain_json
from rollserve.engine.store import GroupRow, RolloutRow
from rollserve.errors import InfraError
from rollserve.handlers.base import AgentHandler, evaluate
from rollserve.llm.routing import call_deadline


class Rescores:
    """The engine's re-scorings, each under an ``idempotency_key`` run once: a request
    waits up to ``wait`` seconds for its run's answer (then ``StillRunning``: the run
    goes on, the same request later gets its answer)."""

    def __init__(self, engine: Engine, wait: float = MAX_WAIT) -> None:
        self._engine = engine
        self.wait = wait
        self._running: dict[str, tuple[str, asyncio.Task[RescoreResponse]]] = {}
        self._waiting: dict[str, int] = {}

    def running(self) -> list[str]:
        """The keys whose re-scoring runs now."""
        return list(self._running)

    def waiting(self, key: str) -> int:
        """How many requests wait for the re-scoring under ``key`` now."""
        return self._waiting.get(key, 0)

    async def rescore(self, request: RescoreRequest) -> RescoreResponse:
        key = request.idempotency_key
        if key is None:
            return await rescore(self._engine, request)
        fingerprint = rescore_hash(request)
        kept = await self._kept(key, fingerprint)  # (first: a retry of a finished run
        if kept is not None:  # is answered even while a reuse of its key is checked)
            return kept
        running = self._running.get(key)
        if running is None:  # (no await between the look-up and the entry: one run per key)
            task = asyncio.create_task(self._run(key, fingerprint, request), name=f"rollserve-rescore-{key[:40]}")
            running = self._running[key] = (fingerprint, task)
            task.add_done_callback(functools.partial(self._done, key))
        if running[0] != fingerprint:
            raise _reused(key)
        self._waiting[key] = self.waiting(key) + 1
        try:
            return await asyncio.wait_for(asyncio.shield(running[1]), self.wait)
        except TimeoutError:
            raise StillRunning(key, retry_after=min(self.wait, 30.0)) from None
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]

    def _done(self, key: str, task: asyncio.Task[RescoreResponse]) -> None:
        self._running.pop(key, None)
        if not task.cancelled():
            task.exception()  # (retrieved: its waiters may all have given up)

    async def _kept(self, key: str, fingerprint: str) -> RescoreResponse | None:
        """The answer kept under ``key`` for this request, if any (a 409 for another)."""
        kept = await self._engine.store.rescore_answer(key)
        if kept is None:
            return None
        if kept[0] != fingerprint:
            raise _reused(key)
        return RescoreResponse.model_validate_json(kept[1])

    async def _run(self, key: str, fingerprint: str, request: RescoreRequest) -> RescoreResponse:
        kept = await self._kept(key, fingerprint)
        if kept is not None:
            return kept
        answer = await rescore(self._engine, request)
        await self._engine.store.keep_rescore_answer(key, fingerprint, answer.model_dump_json())
        return answer

    async def aclose(self) -> None:
        """Cancel the runs still going (the server stops), waiting for them bounded."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLEANUP_TIMEOUT)


def _reused(key: str) -> Conflict:
    return Conflict(
        "idempotency_key", f"key {key!r} was already used for a different re-scoring (other result_ids or judge)"
    )


def scoring_name(judge: JudgeRequest | None) -> str:
    if judge is None:
        return "outcome"
    return f"judge:{judge.rubric if isinstance(judge.rubric, str) else 'inline'}"


async def _stored(engine: Engine, request: RescoreRequest) -> list[RolloutRow]:
    rows = []
    for index, rid in enumerate(request.result_ids):
        row = await engine.store.rollout(rid)
        where = f"result_ids[{index}]"
        if row is None:
            raise NotFound(
                f"{where}: no stored result {rid!r} (unknown, or past the store's retention: --retention-hours)"
            )
        if row.result is None:
            raise InvalidTask(where, f"rollout {rid!r} has no result yet ({row.status})")
        if row.result.status != "completed":  # its EVAL did not score it: as it stands
            raise InvalidTask(
                where,
                f"result {rid!r} is {row.result.status}, not completed: "
                "only what its EVAL scored can be scored again (an agent "
                "failure's 0 and an infrastructure failure's mask stand)",
            )
        try:
            handler = engine.handler(row.spec.data_source)
        except KeyError:  # (the registry's UnknownDataSource)
            raise InvalidTask(
                where, f"result {rid!r}: this server has no {row.spec.data_source!r} family to score it"
            ) from None
        says = getattr(handler, "rescore_problem", None)  # (a duck-typed plugin has none)
        problem = (
            says(row.spec.instance)
            if says is not None
            else "its handler does not say it can be re-scored (AgentHandler.rescore_problem)"
        )
        if problem is not None:
            raise InvalidTask(where, f"{row.spec.data_source}: {problem}")
        stored = getattr(handler, "rescore_result_problem", None)
        problem = stored(row.result.evaluation) if stored is not None else None
        if problem is not None:
            raise InvalidTask(where, f"result {rid!r} ({row.spec.data_source}): {problem}")
        messages = getattr(handler, "rescores_from_messages", True) or request.judge is not None
        if messages and (row.result.trajectory.sequence_count > 1 or not row.result.trajectory.messages):
            raise InvalidTask(where, f"result {rid!r} keeps no single conversation to score")
        rows.append(row)
    return rows


async def rescore(engine: Engine, request: RescoreRequest) -> RescoreResponse:
    """Score the stored results again (all of them checked first: a 4xx names the
    first that cannot be, and nothing is written); the new results, in order."""
    if request.judge is not None:
        problem = engine.context.judge_problem(request.judge)
        if problem is not None:
            raise InvalidTask(f"judge.{problem[0]}", problem[1])
    rows = await _stored(engine, request)
    scoring = scoring_name(request.judge)
    groups: dict[str, str] = {}  # old group -> new group
    for row in rows:
        groups.setdefault(row.group_id, f"{row.group_id}-rs-{uuid.uuid4().hex[:8]}")
    # Each result's scoring (its sandbox, grader, judge) is the rollouts' kind of work: it
    # runs in slices after the trainer's requests, as rollouts do (engine.priority).
    results = await asyncio.gather(
        *(
            asyncio.create_task(
                _one(engine, row, groups[row.group_id], i, request.judge, scoring), context=background_context()
            )
            for i, row in enumerate(rows)
        )
    )
    now = time.time()
    new_groups: dict[str, tuple[GroupRow, list[RolloutSpec]]] = {}
    for row, result in zip(rows, results, strict=True):
        spec = row.spec.model_copy(
            update={
                "id": result.id,
                "group_id": result.group_id,
                "judge": request.judge,
                "oversample": 0,
                "filter_zero_variance": False,
            }
        )
        group = new_groups.setdefault(
            result.group_id, (GroupRow(result.group_id, row.spec.task_id, None, f"rescore:{row.group_id}", 0, now), [])
        )
        group[1].append(spec)
    for group_row, specs in new_groups.values():
        group_row.n = len(specs)
        for spec in specs:
            spec.group_n = len(specs)
    await engine.store.create_groups(list(new_groups.values()))
    out = []
    for row, result in zip(rows, results, strict=True):
        seq = await engine.store.finish(result)
        out.append(
            Rescored(
                rescored_from=row.id,
                id=result.id,
                group_id=result.group_id,
                seq=seq,
                reward=result.reward,
                mask=result.mask,
            )
        )
    return RescoreResponse(scoring=scoring, results=out)


async def _one(
    engine: Engine, row: RolloutRow, group_id: str, index: int, judge: JudgeRequest | None, scoring: str
) -> RolloutResult:
    """One stored result scored again: its family's init (restore), then evaluate, each
    bounded by its stage's limit and holding a slot of the engine's pool for that stage
    (``--init-workers``, ``--eval-workers``) while it runs, as a rollout's stage does."""
    assert row.result is not None
    old = row.result
    handler: AgentHandler = engine.handler(row.spec.data_source)
    spec = row.spec.model_copy(update={"judge": judge, "id": f"{group_id}-{index}", "group_id": group_id})
    rollout = new_rollout(spec, 1, handler.defaults, engine.config)
    rollout.trajectory = Trajectory(
        messages=[m.model_dump(mode="json", exclude_none=True) for m in old.trajectory.messages]
    )
    began = time.monotonic()
    update: dict[str, object] = {
        "id": spec.id,
        "group_id": group_id,
        "seq": None,
        "scoring": scoring,
        "rescored_from": old.id,
    }
    stage: FailureStage = "init"
    try:
        restore = getattr(handler, "restore", None)  # (a duck-typed plugin: its init)
        async with engine.pools["init"].slot():
            await asyncio.wait_for(
                restore(rollout, old.evaluation) if restore is not None else handler.init(rollout),
                rollout.timeouts.init,
            )
        stage = "eval"
        async with engine.pools["eval"].slot(), asyncio.timeout(rollout.timeouts.eval) as limit:
            with call_deadline(limit.when()):  # the judges' calls end within the stage
                evaluation = await evaluate(handler, rollout)
    except Exception as exc:  # an infrastructure failure (or any other): masked, never scored
        if isinstance(exc, TimeoutError):
            limit_s = rollout.timeouts.init if stage == "init" else rollout.timeouts.eval
            message = str(exc) or f"{stage.upper()} ran past {limit_s:g} s"
        else:
            message = str(exc) if isinstance(exc, InfraError) else f"{type(exc).__name__}: {exc}"
        update.update(
            reward=None,
            evaluation=None,
            reward_components=None,
            mask=True,
            status="failed",
            mask_reason=f"infra failure in {stage}: {message}"[:600],
            failure=Failure(stage=stage, kind="infra", message=message[:500]),
        )
    else:
        update.update(
            reward=float(evaluation.reward),
            evaluation=plain_json(evaluation.details),
            reward_components=evaluation.reward_components(),
            mask=old.mask,
            mask_reason=old.mask_reason,
        )
    finally:  # bounded, as the pipeline's cleanup is
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.wait_for(handler.cleanup(rollout), CLEANUP_TIMEOUT))
    timing = old.timing.model_copy(update={"eval": round(time.monotonic() - began, 6)})
    update["timing"] = timing
    return old.model_copy(update=update)

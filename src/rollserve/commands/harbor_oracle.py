"""``rollserve datasets oracle DIR``: trust a folder of Harbor tasks before training on it.

A server in this process (the harbor family with the operator's modes on, its root
DIR, no network, no model) runs every task twice through the same API, handler and
verifier as a training rollout: once with the oracle (``solution/solve.sh`` in place of
the agent, the solution copied to ``/solution`` for it alone) and once with the empty
agent (nothing runs). A task passes when the oracle's reward is 1 and the empty
agent's is 0; a task refused at submit, masked, or scored otherwise fails, with why.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollserve.datasets import harbor_root, task_folders

MODES = ("oracle", "none")
WAIT = 60.0  # seconds per long-poll
WAIT_BOUND = 7200.0  # seconds one rollout may take: over the harbor family's 5400 s total


class OracleWaitError(Exception):
    """A rollout the check could not see end: the API answered otherwise than with its
    view, or it was not done within the bound."""


@dataclass
class TaskCheck:
    task: str
    oracle: float | None = None
    empty: float | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


async def check_tasks(
    folder: Path, runtime: str, handler_options: dict[str, dict[str, Any]], sandbox_options: dict[str, Any]
) -> list[TaskCheck]:
    import httpx

    from rollserve.api.app import create_app
    from rollserve.server import ServerConfig, Service

    folder = folder.resolve()
    tasks = task_folders(folder)
    root = harbor_root(folder)
    harbor = {**handler_options.get("harbor", {}), "root": str(root), "operator_modes": True}
    with tempfile.TemporaryDirectory(prefix="rollserve-oracle-") as state:
        config = ServerConfig(
            state_dir=Path(state),
            sandbox_runtime=runtime,
            sandbox_options=sandbox_options,
            handler_options={**handler_options, "harbor": harbor},
        )
        service = Service(config)
        await service.start()
        app = create_app(service, manage_lifecycle=False)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://rollserve", timeout=WAIT + 30
        )
        try:
            return list(await asyncio.gather(*(_check(client, t.relative_to(root).as_posix()) for t in tasks)))
        finally:
            await client.aclose()
            await service.stop()


async def _check(client: Any, task: str) -> TaskCheck:
    check = TaskCheck(task)
    results: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "harbor", "instance": {"task": task, "agent": mode}}]}
        )
        if r.status_code != 202:
            errors = r.json().get("errors") or [{"message": r.text}]
            check.problem = f"refused: {errors[0].get('message')}"
            return check
        (rid,) = r.json()["groups"][0]["rollout_ids"]
        try:
            results[mode] = await _wait(client, rid)
        except OracleWaitError as error:
            check.problem = f"{mode}: {error}"
            return check
    oracle, empty = results["oracle"], results["none"]
    check.oracle, check.empty = oracle.get("reward"), empty.get("reward")
    check.problem = _problem(oracle, empty)
    return check


async def _wait(client: Any, rid: str, bound: float = WAIT_BOUND) -> dict[str, Any]:
    """The rollout's result once done; ``OracleWaitError`` on an answer other than its
    view (not found, an error), or when it is not done within ``bound`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while (left := end - loop.time()) > 0:  # each poll bounded, and the whole wait
        r = await client.get(f"/v1/rollouts/{rid}", params={"wait": min(WAIT, left)})
        if r.status_code != 200:
            raise OracleWaitError(f"rollout {rid}: the server answered {r.status_code}: {r.text[:300]}")
        view = r.json()
        if view.get("done"):
            return dict(view["result"])
    raise OracleWaitError(f"rollout {rid} was not done within {bound:g}s")


def _problem(oracle: dict[str, Any], empty: dict[str, Any]) -> str | None:
    for who, result in (("oracle", oracle), ("empty agent", empty)):
        if result["status"] != "completed" or result["mask"]:
            failure = result.get("failure") or {}
            return f"{who}: {result['status']}: {failure.get('message') or result.get('mask_reason')}"
    details = oracle.get("evaluation") or {}
    if oracle["reward"] is None or oracle["reward"] < 1.0:
        why = details.get("reason") or details.get("test_output_tail", "")[-300:]
        return f"the oracle scores {oracle['reward']} (solve.sh exit code {details.get('oracle_exit_code')}): {why}"
    if empty["reward"] is None or empty["reward"] != 0.0:
        return f"the empty agent scores {empty['reward']}: the tests pass without any work"
    return None

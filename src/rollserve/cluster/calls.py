"""The Ray calls that can block the head's event loop, made off it.

``ray.kill`` waits (in C++, the GIL released, the calling thread held) until an actor
still registering with the GCS has registered (``CoreWorker::KillActor``: a promise
it waits on), so it runs on a thread of its own pool, never on the event loop.
``ray.nodes`` is a GCS request bounded only by Ray's own RPC timeout: it runs on the
same pool, one at a time (``NodeWatch._scan`` skips a look while the last one still
waits), so a slow GCS never fills the default pool that the head's other work
(results, the reaper) shares.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import RayError

log = logging.getLogger(__name__)

# Kills and node listings: a few at a time, apart from the default pool.
POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollserve-ray")
_pending: set[Future[None]] = set()  # kills under way (``wait_killed``)


def _kill_now(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except (RayError, ValueError) as exc:
        log.debug("ray.kill: %s", exc)  # already gone


def kill(actor: Any) -> None:
    """Kill a worker actor (``ray.kill``) on the ray pool; returns at once."""
    future = POOL.submit(_kill_now, actor)
    _pending.add(future)
    future.add_done_callback(_pending.discard)


async def wait_killed(timeout: float) -> None:
    """Wait (bounded) for the kills under way."""
    pending = [asyncio.wrap_future(f) for f in list(_pending)]
    if pending:
        await asyncio.wait(pending, timeout=timeout)


async def nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` on the ray pool."""
    return await asyncio.get_running_loop().run_in_executor(POOL, ray.nodes)

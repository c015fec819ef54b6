"""A warm pool of sandboxes: INIT takes one that is already started.

What can be pooled. A sandbox is shaped at its start by every field of its spec but
two: ``files`` (workspace files, written here at acquisition, as the rollout's own)
and ``start_timeout`` (how long its commands' launchers may take to come up: the
rollout's own from acquisition on). So a pool is keyed by the runtime (one pool per
server runtime) and the spec without those two (``pool_key``): image, env, network,
limits, aliases, seed, own folders, hidden folders, read-only binds. A spec with
both a ``workspace_seed`` and ``files`` is never pooled: started cold, its files are
written before the seed is copied over them, which writing them after start would
reverse.

How a pooled sandbox is used. ``acquire`` pops one (the oldest) ready sandbox of the
spec's key, writes the spec's files into its workspace (as the runtime's
``write_file`` does: owned by the sandbox's uid), gives it the rollout's spec and
hands it out; it is never taken back: the rollout closes it like a cold one
(``close`` kills everything in it, removes its folders and owner record). Nothing a
rollout leaves in one reaches another. A pooled sandbox is started by the same
``Runtime.start`` as a cold one: the same owner record (a crashed server's pool is
reaped by the next server like any other sandbox), the same caps and their watchers
(running from its start, over the same folder and limits).

How big. Per key, the demand is the number of acquisitions (hits and misses) in the
last ``window`` seconds, counted from ``MIN_DEMAND`` on (a spec asked for once, e.g.
a task's own image, is not pooled: nothing is started that no one takes); the pool
refills each key toward its demand, the keys with the most demand first, never
holding more than ``capacity`` sandboxes (ready and starting) over all keys, and
closes what a key holds past its demand (so a key no longer asked for empties
within ``window`` seconds). ``capacity`` 0: no pool.
``aclose`` (server stop) stops refilling and closes every sandbox the pool holds.

A sandbox broken while it waited (``Sandbox.alive``: e.g. its folders removed under it,
for bubblewrap, whose idle sandbox runs no process) is never handed out: ``acquire``
closes it and takes the next (or none: a cold start), and each refill round drops the
broken ones first, so the pool starts others.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollserve.sandbox.base import Sandbox, SandboxError, SandboxSpec

__all__ = ["Demand", "SandboxPool", "pool_key"]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 10.0  # seconds of acquisitions a key's demand counts
REFILL_PARALLEL = 4  # sandboxes started at once while refilling
RETRY_AFTER = 1.0  # seconds before a key whose start failed is refilled again
CLOSE_TIMEOUT = 30.0  # seconds ``aclose`` waits for starts under way
MIN_DEMAND = 2  # acquisitions of a key in the window before it is pooled


def pool_key(spec: SandboxSpec) -> str | None:
    """The key of the pool ``spec``'s sandbox can come from (what shapes it at start);
    None where it cannot be pooled (see the module's doc)."""
    if spec.workspace_seed is not None and spec.files:
        return None
    return spec.model_dump_json(exclude={"files", "start_timeout"})


class Demand:
    """Acquisitions of one key in the last ``window`` seconds (a bounded count: at most
    ``limit`` are remembered, the most the pool could hold)."""

    def __init__(self, window: float, limit: int) -> None:
        self.window = window
        self._times: collections.deque[float] = collections.deque(maxlen=max(limit, 1))

    def record(self, now: float) -> None:
        self._times.append(now)

    def count(self, now: float) -> int:
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()
        return len(self._times)


@dataclass
class _Key:
    spec: SandboxSpec  # what its sandboxes start from (no files)
    demand: Demand
    ready: collections.deque[Sandbox] = field(default_factory=collections.deque)
    starting: int = 0
    retry_at: float = 0.0  # after a failed start: not refilled before this


def targets(demands: dict[str, int], capacity: int) -> dict[str, int]:
    """How many sandboxes each key should hold: its demand (none below MIN_DEMAND),
    the keys with the most demand served first, ``capacity`` in all."""
    left = capacity
    out: dict[str, int] = {}
    for key in sorted(demands, key=lambda k: -demands[k]):
        out[key] = min(demands[key] if demands[key] >= MIN_DEMAND else 0, left)
        left -= out[key]
    return out


class SandboxPool:
    """Sandboxes started ahead of demand, each handed out once (see the module's doc).

    ``start`` starts one (the runtime's ``start``); ``on_handout`` is told of each
    sandbox ``acquire`` hands out (the server counts it as open from then on)."""

    def __init__(
        self,
        start: Callable[[SandboxSpec], Awaitable[Sandbox]],
        capacity: int,
        *,
        window: float = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"pool capacity must be >= 0, not {capacity}")
        self.capacity = capacity
        self.window = window
        self._start = start
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closing_dead: set[asyncio.Task[None]] = set()  # closes of broken sandboxes (``aclose`` waits)
        self.hits = 0  # acquisitions served from the pool
        self.misses = 0  # acquisitions of a poolable spec with none ready (started cold)
        self.unpoolable = 0  # acquisitions of a spec that cannot be pooled
        self.started = 0  # sandboxes the pool started
        self.trimmed = 0  # sandboxes it closed unused (past demand, or at shutdown)
        self.failed = 0  # starts that failed
        self.dead = 0  # ready sandboxes found broken (``Sandbox.alive``) and closed

    # -- handing out --------------------------------------------------------------------

    async def acquire(self, spec: SandboxSpec) -> Sandbox | None:
        """A started sandbox for ``spec`` (its files written, never handed out again), or
        None: none ready (the caller starts one cold), or no pool. Counts the demand."""
        if self.capacity == 0 or self._closing:
            return None
        key = pool_key(spec)
        if key is None:
            self.unpoolable += 1
            return None
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(spec.model_copy(update={"files": {}}), Demand(self.window, self.capacity))
        entry.demand.record(self._clock())
        self._kick()
        while entry.ready:
            sandbox = entry.ready.popleft()
            if sandbox.closed:
                continue
            if not sandbox.alive():  # broken while it waited: closed, and the next one tried
                self._discard_dead([sandbox])
                continue
            await _prepare(sandbox, spec)
            self.hits += 1
            return sandbox
        self.misses += 1
        return None

    # -- refilling and trimming ---------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._maintain(), name="rollserve-sandbox-pool")

    async def _maintain(self) -> None:
        """Refill toward the demand and trim past it, until no key is left."""
        while not self._closing and self._keys:
            self._wake.clear()
            await self.step()
            if self._closing or not self._keys:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), self.window / 4)
            except TimeoutError:
                pass

    async def step(self) -> None:
        """One round: close what each key holds past its demand, or broken, and start
        what it lacks."""
        for entry in self._keys.values():
            dead = [s for s in entry.ready if not s.closed and not s.alive()]
            if dead:
                entry.ready = collections.deque(s for s in entry.ready if s not in dead)
                self._discard_dead(dead)
        now = self._clock()
        demands = {key: entry.demand.count(now) for key, entry in self._keys.items()}
        wanted = targets(demands, self.capacity)
        await self._trim(wanted)
        for key, target in wanted.items():
            entry = self._keys[key]
            if entry.retry_at > now:
                continue
            missing = min(target - len(entry.ready) - entry.starting, self.capacity - self.held())
            if missing > 0:
                await self._refill(entry, missing)
            if self._closing:
                return
        # (a key made while this round awaited has demand of its own: read now, not above)
        for key in [k for k, e in self._keys.items() if not e.ready and not e.starting and e.demand.count(now) == 0]:
            del self._keys[key]

    async def _trim(self, wanted: dict[str, int]) -> None:
        extra: list[Sandbox] = []
        for key, entry in self._keys.items():
            while len(entry.ready) > wanted.get(key, 0):
                extra.append(entry.ready.popleft())  # the oldest first
        if extra:
            self.trimmed += len(extra)
            await _close_all(extra)

    async def _refill(self, entry: _Key, missing: int) -> None:
        while missing > 0 and not self._closing:
            batch = min(missing, REFILL_PARALLEL)
            missing -= batch
            entry.starting += batch
            starts = [asyncio.ensure_future(self._start(entry.spec)) for _ in range(batch)]
            gathered = asyncio.gather(*starts, return_exceptions=True)
            try:
                # Shielded: a cancel must not abandon sandboxes half-way through their start.
                results = await asyncio.shield(gathered)
            except asyncio.CancelledError:  # (shutdown gave up waiting: close them once started)
                gathered.add_done_callback(_close_once_started)
                raise
            finally:
                entry.starting -= batch
            fresh = [r for r in results if isinstance(r, Sandbox)]
            self.started += len(fresh)
            errors = [r for r in results if isinstance(r, BaseException)]
            if self._closing:
                await _close_all(fresh)
                return
            entry.ready.extend(fresh)
            if errors:
                self.failed += len(errors)
                entry.retry_at = self._clock() + RETRY_AFTER
                log.warning("sandbox pool: %d starts failed: %s", len(errors), errors[0])
                return

    def _discard_dead(self, sandboxes: list[Sandbox]) -> None:
        """Close broken sandboxes (what is left of them: processes, folders, owner
        records) without making the acquisition wait."""
        self.dead += len(sandboxes)
        log.warning("sandbox pool: %d ready sandboxes were broken while idle; closed", len(sandboxes))
        task = asyncio.ensure_future(_close_all(sandboxes))
        self._closing_dead.add(task)
        task.add_done_callback(self._closing_dead.discard)

    # -- status and shutdown ------------------------------------------------------------

    def held(self) -> int:
        """Sandboxes ready or starting, over all keys."""
        return sum(len(e.ready) + e.starting for e in self._keys.values())

    def ready(self) -> list[Sandbox]:
        return [s for e in self._keys.values() for s in e.ready if not s.closed]

    def status(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "window_s": self.window,
            "ready": len(self.ready()),
            "starting": sum(e.starting for e in self._keys.values()),
            "keys": len(self._keys),
            "hits": self.hits,
            "misses": self.misses,
            "unpoolable": self.unpoolable,
            "started": self.started,
            "trimmed": self.trimmed,
            "failed": self.failed,
            "dead": self.dead,
        }

    async def aclose(self) -> None:
        """Stop refilling; close every sandbox the pool holds (a start under way is
        waited for, at most CLOSE_TIMEOUT seconds, and closed; one still under way then
        is closed when it ends); the closes of broken sandboxes still running are
        waited for too, at most CLOSE_TIMEOUT seconds. Idempotent."""
        self._closing = True
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT)
            except TimeoutError:
                log.error("sandbox pool: starts still under way after %ss", CLOSE_TIMEOUT)
                task.cancel()
            except Exception:  # its own failure: logged, the pool still empties
                log.exception("sandbox pool: refill task failed")
        left = [s for e in self._keys.values() for s in e.ready]
        for entry in self._keys.values():
            entry.ready.clear()
        self.trimmed += len(left)
        await _close_all(left)
        if self._closing_dead:
            _, late = await asyncio.wait(list(self._closing_dead), timeout=CLOSE_TIMEOUT)
            if late:
                log.error(
                    "sandbox pool: %d closes of broken sandboxes still running after %ss", len(late), CLOSE_TIMEOUT
                )


async def _prepare(sandbox: Sandbox, spec: SandboxSpec) -> None:
    """Make a pooled sandbox ``spec``'s: its files written, its spec the rollout's. A
    file that cannot be written closes it and is a SandboxError, as at a cold start."""
    try:
        for name, text in spec.files.items():
            await sandbox.write_file(name, text)
    except (OSError, ValueError) as error:
        await sandbox.close()
        raise SandboxError(f"{sandbox.runtime} sandbox could not start: {error}") from error
    except BaseException:  # cancelled (or anything else) before a rollout holds it: closed
        await asyncio.shield(sandbox.close())
        raise
    sandbox.spec = spec


_closing_late: set[asyncio.Task[None]] = set()  # (referenced until done)


def _close_once_started(gathered: asyncio.Future[list[Any]]) -> None:
    """Close the sandboxes of starts the pool stopped waiting for, once they are made."""
    if gathered.cancelled():
        return
    made = [r for r in gathered.result() if isinstance(r, Sandbox)]
    if made:
        task = asyncio.ensure_future(_close_all(made))
        _closing_late.add(task)
        task.add_done_callback(_closing_late.discard)


async def _close_all(sandboxes: list[Sandbox]) -> None:
    results = await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    for sandbox, result in zip(sandboxes, results):
        if isinstance(result, BaseException):
            log.error("sandbox pool: could not close sandbox %s: %r", sandbox.id, result)

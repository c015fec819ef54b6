"""CPU-heavy scoring off the event loop: a process pool with a per-task timeout.

Scoring an answer (sympy via math-verify, a reasoning-gym checker) can take
arbitrarily long on a pathological answer such as ``9^{9^{9^{9}}}``, and some of
that time is spent inside C code that no signal interrupts. So scoring runs in
worker processes (``pebble.ProcessPool``): a task past its timeout has its worker
killed and replaced, and cancelling the awaiting asyncio task kills the worker
that runs it. The event loop only ever awaits a future.

Failure kinds (see ``rollserve.errors``):

- ``ScoringTimeout``: the task ran past its timeout. That is the answer's fault
  (a sane answer scores in milliseconds), so it is an ``AgentError``; handlers
  turn it into reward 0 with ``{"timeout": true}`` in the details.
- ``ScoringUnavailable``: the pool is not started, closed, broken, or a worker
  died without a result. That is infrastructure: an ``InfraError`` (masked).
- Anything ``fn`` raises is re-raised as is (pebble keeps the remote traceback
  on ``exc.traceback``): that is the scoring function's own bug or verdict.

Workers are started with the ``forkserver`` method (never plain ``fork``: the
server has threads, and a forked copy of a locked mutex deadlocks). The fork
server preloads the scoring modules, so a replacement worker is a cheap fork with
sympy already imported. No process outlives the server, even a SIGKILLed one:
the fork server exits when the server's end of its keep-alive pipe closes, and
each worker is SIGKILLed by the kernel when its parent exits (``_init_worker``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal, TypeVar

from pebble import ProcessExpired, ProcessPool

from rollserve.errors import AgentError, InfraError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Imported once by the fork server, so forked workers start warm (sympy alone takes
# about a second to import; math.scoring brings handlers.latex). Not reasoning_gym: it
# imports numpy, whose OpenBLAS starts threads, and the fork server must stay
# single-threaded to fork safely; workers import it on first use instead. A module
# that fails to import is skipped.
DEFAULT_PRELOAD: tuple[str, ...] = ("math_verify", "rollserve.handlers.math.scoring")


class ScoringTimeout(AgentError, TimeoutError):
    """A scoring task ran past its timeout; its worker was killed.

    Also a ``TimeoutError`` (hence ``asyncio.TimeoutError``), so code that only
    knows "a wait ran out" still catches it.
    """


class ScoringUnavailable(InfraError):
    """The scoring pool cannot run tasks (not started, closed, broken, worker died)."""


def drop_keepalive(server: object) -> Literal["closed", "none", "unknown"]:
    """Close this process's copy of the fork server's keep-alive pipe (the write end
    CPython hands every process the fork server forks; see ``_init_worker``).

    CPython keeps it on a private attribute of its fork server singleton
    (``multiprocessing.forkserver._forkserver._forkserver_alive_fd``) and no public
    API reaches it, so it is read here only, guarded. "closed": it was closed (and
    cleared, so multiprocessing does not close it again); "none": there is none to
    close (a "spawn" worker); "unknown": ``server`` has no such attribute (another
    Python's layout), and nothing is changed. Never call it in the server itself:
    its own copy is what keeps the fork server alive.
    """
    if server is None or not hasattr(server, "_forkserver_alive_fd"):
        return "unknown"
    keepalive_fd = server._forkserver_alive_fd
    if not isinstance(keepalive_fd, int):
        return "none"
    try:
        os.close(keepalive_fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None
    return "closed"


def _init_worker(server_pid: int, context: str = "forkserver") -> None:
    """Runs first in every worker: make sure it cannot outlive the server.

    A forkserver worker's parent is the fork server, which exits when the last
    holder of its keep-alive pipe goes away. CPython hands every forked process a
    copy of that pipe, so workers would keep the fork server (and so themselves)
    alive after a SIGKILLed server. Dropping the copy lets the fork server exit with
    the server; PR_SET_PDEATHSIG then kills the worker when its parent exits, even
    mid-computation in C code that ignores SIGTERM.
    """
    from multiprocessing import forkserver

    dropped = drop_keepalive(getattr(forkserver, "_forkserver", None))
    if context == "forkserver" and dropped != "closed":
        log.warning(
            "scoring worker: this Python's multiprocessing keeps no fork server "
            "keep-alive pipe where CPython 3.11 did; a SIGKILLed server may leave "
            "its fork server and workers behind"
        )
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The server (or our parent) may have died before the prctl: nobody would tell us.
    try:
        os.kill(server_pid, 0)
    except ProcessLookupError:
        os._exit(1)
    if os.getppid() == 1:
        os._exit(1)


class ScoringPool:
    """A small process pool for scoring, shared by every handler of a server.

    ``start()`` and ``close()`` are synchronous: the first ``start`` of a process
    waits about a second for the fork server to import the preloaded modules, and
    ``close`` up to a few seconds for a stuck worker to die. Inside a running event
    loop use ``astart()`` / ``aclose()`` (the same, in a thread). ``score`` starts
    the pool on first use if nobody did.

    ``context="spawn"`` also works (tests, debugging); then each worker's parent is
    the thread that started it, and PR_SET_PDEATHSIG fires when *that thread* ends.
    """

    def __init__(
        self,
        workers: int = 2,
        default_timeout: float = 10.0,
        *,
        context: str = "forkserver",
        preload: Sequence[str] = DEFAULT_PRELOAD,
    ):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if default_timeout <= 0:
            raise ValueError("default_timeout must be > 0")
        if context == "fork":
            raise ValueError("the 'fork' start method is unsafe in a threaded server")
        self.workers = workers
        self.default_timeout = default_timeout
        self.context = context
        self.preload = tuple(preload)
        self._pool: ProcessPool | None = None
        self._closed = False
        self._in_flight: set[concurrent.futures.Future] = set()
        self._start_lock = asyncio.Lock()

    # --- lifecycle ----------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._pool is not None and self._pool.active

    def start(self) -> None:
        """Start the workers now (idempotent), so the first score is not slowed."""
        if self._pool is not None:
            return
        if self._closed:
            raise ScoringUnavailable("the scoring pool is closed")
        mp_context = multiprocessing.get_context(self.context)
        if self.context == "forkserver" and self.preload:
            # Only takes effect if the fork server is not running yet (it is shared
            # by the whole process); otherwise workers import on first use.
            mp_context.set_forkserver_preload(list(self.preload))
        pool = ProcessPool(
            max_workers=self.workers,
            initializer=_init_worker,
            initargs=(os.getpid(), self.context),
            context=mp_context,
        )
        pool.active  # noqa: B018 - pebble starts its workers lazily; start them now
        self._pool = pool
        log.info("scoring pool started: %d workers (%s)", self.workers, self.context)

    def close(self) -> None:
        """Stop the pool, killing any running task; idempotent."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        pool.stop()  # workers are terminated (killed after a grace period)
        pool.join()
        # pebble leaves the futures of unfinished tasks pending; resolve them so no
        # caller awaits forever (they see ScoringUnavailable).
        for future in list(self._in_flight):
            future.cancel()

    async def astart(self) -> None:
        """``start`` in a thread: the first start waits for the fork server to
        import the preloaded modules (a second or two), which must not block the loop."""
        async with self._start_lock:
            if self._pool is None:
                await asyncio.to_thread(self.start)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> ScoringPool:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- scoring ------------------------------------------------------------
    async def score(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` in a worker and return its result.

        ``fn`` and ``args`` must be picklable: ``fn`` a module-level function.
        The timeout (default ``default_timeout``) counts from when a worker picks
        the task up. Cancelling the awaiting task kills the worker running it.
        """
        limit = self.default_timeout if timeout is None else timeout
        if self._pool is None:
            await self.astart()
        assert self._pool is not None
        try:
            future = self._pool.schedule(fn, args=args, timeout=limit)
        except RuntimeError as exc:  # pebble: "The Pool is not active" / internal error
            raise ScoringUnavailable(f"scoring pool cannot take tasks: {exc}") from exc
        self._in_flight.add(future)
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.TimeoutError as exc:
            if isinstance(exc, ScoringTimeout):
                raise
            name = getattr(fn, "__qualname__", repr(fn))
            raise ScoringTimeout(f"scoring ({name}) took longer than {limit:g}s") from exc
        except ProcessExpired as exc:
            raise ScoringUnavailable(f"scoring worker died (exit code {exc.exitcode}) without a result") from exc
        except BrokenProcessPool as exc:
            raise ScoringUnavailable(f"scoring pool is broken: {exc}") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller was cancelled; the worker is being killed
            # Nobody cancelled us: the pool was closed under a pending task.
            raise ScoringUnavailable("scoring pool closed while the task was pending") from None
        finally:
            self._in_flight.discard(future)


async def score_in_pool(pool: ScoringPool, fn: Callable[..., T], *args: Any, what: str) -> T:
    """``pool.score(fn, *args)`` for a handler: ``fn``'s own exceptions (a generator
    or scorer bug) are infrastructure, never a verdict on the agent (``what`` names
    the job in the InfraError); a ``ScoringTimeout`` is re-raised for the caller to
    judge (an answer that takes forever to score is usually the agent's doing)."""
    try:
        return await pool.score(fn, *args)
    except (ScoringTimeout, InfraError):
        raise
    except Exception as exc:
        raise InfraError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

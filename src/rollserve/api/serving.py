"""Serving the app over HTTP (uvicorn) so that a shutdown does not wait on open requests.

At SIGTERM or SIGINT uvicorn stops accepting connections and waits up to its graceful
timeout for the open ones to finish; a long-poll (``?wait=``) or an event stream would
hold it that long and then be cancelled mid-response (an ASGI traceback in the log).
``Server`` tells the service at the signal (``ApiService.begin_shutdown``): long-polls
answer what they have and streams end at once, so the shutdown goes on without them.

Once started (the service's start-up done, the sockets bound), the server can freeze the
heap start-up made (``freeze_heap``): imported modules, their classes and models, the
tokenizer. ``gc.freeze()`` moves them to the collector's permanent generation, which no
collection walks, so a full collection walks what the rollouts made and not those again.
Objects made after it are tracked and collected as before: a cycle a rollout leaves is
still freed. ``gc_gen0`` sets the young generation's threshold at the same point: with
Python's 700, the objects of rollouts in flight are soon promoted to the oldest
generation, whose collections (each walking every object there) then run again each
time it grows by a quarter; a larger young generation collects less often, so far
fewer full collections run, and cycles are still collected.

``rollout_slice_ms`` makes the loop ``engine.priority.ApiFirstLoop``: the rollouts' work
runs in slices of about that many milliseconds between two passes over the requests and
the I/O, so a ``GET /v1/status`` waits for a slice at each of its steps, not for all the
rollout work that is ready (a garbage collection still stops it: docs/benchmarks.md);
``None``: asyncio's (uvloop's) own loop, one queue for all.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from rollserve.api.base import ApiService
from rollserve.engine.priority import loop_factory

__all__ = ["Server", "freeze_startup_heap", "serve", "set_young_threshold"]


class Server(uvicorn.Server):
    """uvicorn's server; a shutdown signal also begins the service's shutdown, and once
    started it freezes the start-up's heap and sets the young generation's threshold
    (as asked: ``freeze_heap``, ``gc_gen0``)."""

    def __init__(
        self, config: uvicorn.Config, service: ApiService, *, freeze_heap: bool = False, gc_gen0: int | None = None
    ) -> None:
        super().__init__(config)
        self.service = service
        self.freeze_heap = freeze_heap
        self.gc_gen0 = gc_gen0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:
            return
        if self.freeze_heap:
            freeze_startup_heap()
        if self.gc_gen0 is not None:
            set_young_threshold(self.gc_gen0)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # A signal handler runs between two bytecodes of the loop's own thread: the
            # waits it ends are woken from the loop, not from here.
            loop.call_soon_threadsafe(self.service.begin_shutdown)
        super().handle_exit(sig, frame)


def freeze_startup_heap() -> int:
    """Collect what is garbage now, then freeze every object still tracked (``gc.freeze``);
    returns how many are frozen. Collection goes on for the objects made afterwards."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def set_young_threshold(gen0: int) -> None:
    """The young generation's threshold (``gc.set_threshold``), the others as they are;
    never 0, which would stop automatic collection."""
    if gen0 < 1:
        raise ValueError(f"gc_gen0 must be at least 1, not {gen0}")
    gc.set_threshold(gen0, *gc.get_threshold()[1:])


def serve(
    app: Any,
    service: ApiService,
    *,
    freeze_heap: bool = False,
    gc_gen0: int | None = None,
    rollout_slice_ms: float | None = None,
    **config: Any,
) -> None:
    """Run ``app`` until a signal stops it, as ``uvicorn.run(app, **config)`` does;
    once started, ``freeze_heap`` freezes the start-up's heap (``freeze_startup_heap``)
    and ``gc_gen0`` sets the young generation's threshold (``set_young_threshold``);
    ``rollout_slice_ms`` puts the requests ahead of the rollouts' work (module doc)."""
    if rollout_slice_ms is not None:
        config["loop"] = loop_factory(rollout_slice_ms / 1000)
    server = Server(uvicorn.Config(app, **config), service, freeze_heap=freeze_heap, gc_gen0=gc_gen0)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)

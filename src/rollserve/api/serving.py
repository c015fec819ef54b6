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
still freed.
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

__all__ = ["Server", "freeze_startup_heap", "serve"]


class Server(uvicorn.Server):
    """uvicorn's server; a shutdown signal also begins the service's shutdown."""

    def __init__(self, config: uvicorn.Config, service: ApiService, *, freeze_heap: bool = False) -> None:
        super().__init__(config)
        self.service = service
        self.freeze_heap = freeze_heap
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.freeze_heap and not self.should_exit:
            freeze_startup_heap()

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


def serve(app: Any, service: ApiService, *, freeze_heap: bool = False, **config: Any) -> None:
    """Run ``app`` until a signal stops it, as ``uvicorn.run(app, **config)`` does;
    ``freeze_heap``: freeze the start-up's heap once started (``freeze_startup_heap``)."""
    server = Server(uvicorn.Config(app, **config), service, freeze_heap=freeze_heap)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)

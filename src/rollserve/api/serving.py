"""Serving the app over HTTP (uvicorn) so that a shutdown does not wait on open requests.

At SIGTERM or SIGINT uvicorn stops accepting connections and waits up to its graceful
timeout for the open ones to finish; a long-poll (``?wait=``) or an event stream would
hold it that long and then be cancelled mid-response (an ASGI traceback in the log).
``Server`` tells the service at the signal (``ApiService.begin_shutdown``): long-polls
answer what they have and streams end at once, so the shutdown goes on without them.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from rollserve.api.base import ApiService

__all__ = ["Server", "serve"]


class Server(uvicorn.Server):
    """uvicorn's server; a shutdown signal also begins the service's shutdown."""

    def __init__(self, config: uvicorn.Config, service: ApiService) -> None:
        super().__init__(config)
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # A signal handler runs between two bytecodes of the loop's own thread: the
            # waits it ends are woken from the loop, not from here.
            loop.call_soon_threadsafe(self.service.begin_shutdown)
        super().handle_exit(sig, frame)


def serve(app: Any, service: ApiService, **config: Any) -> None:
    """Run ``app`` until a signal stops it, as ``uvicorn.run(app, **config)`` does."""
    server = Server(uvicorn.Config(app, **config), service)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)

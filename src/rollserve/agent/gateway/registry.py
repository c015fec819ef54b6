"""The live gateway sessions, by key (one server-wide ``Gateway``).

A key is a fresh secret (``secrets.token_urlsafe``: 192 bits) made when a rollout's
RUN opens its session and forgotten when the session closes, so it names exactly one
live rollout: a key of another rollout, an ended one or a made-up one finds nothing
here (the harness is refused: ``UnknownKey``).
"""

from __future__ import annotations

import asyncio
import secrets

from rollserve.agent.gateway.session import GatewaySession

__all__ = ["KEY_PREFIX", "Gateway"]

KEY_PREFIX = "rsg-"


class Gateway:
    """Sessions by key, and each rollout's key (for the trainer)."""

    def __init__(self) -> None:
        self._by_key: dict[str, GatewaySession] = {}
        self._keys: dict[str, str] = {}  # rollout id -> key
        self._changed = asyncio.Event()

    def open(self, session: GatewaySession) -> str:
        """Register ``session`` under a new key, which it returns."""
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        self._by_key[key] = session
        self._keys[session.rollout_id] = key
        self._notify()
        return key

    def close(self, session: GatewaySession) -> None:
        """Forget ``session``: its key finds nothing from now on."""
        for key in [k for k, live in self._by_key.items() if live is session]:
            del self._by_key[key]
        if self._keys.get(session.rollout_id) not in self._by_key:  # else a newer attempt's
            self._keys.pop(session.rollout_id, None)
        session.finish("finished")
        self._notify()

    def get(self, key: str) -> GatewaySession | None:
        return self._by_key.get(key)

    def __len__(self) -> int:
        return len(self._by_key)

    async def key_of(self, rollout_id: str, wait: float) -> tuple[str, GatewaySession] | None:
        """The rollout's key and session, waiting up to ``wait`` seconds for it to open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            key = self._keys.get(rollout_id)
            if key is not None:
                return key, self._by_key[key]
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

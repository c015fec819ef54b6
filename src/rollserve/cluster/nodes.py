"""The head's book of nodes: each node's worker, slots and what it hosts, and where
a new rollout goes (no ray import here).

A rollout's attempt is placed before its INIT (``RayExecutor.reserve``), on the
alive, not draining node with a free slot that is least loaded (hosted / slots;
ties: the fewest placed so far), and stays there until its cleanup: its sandboxes and handler state live in that node's
worker, so RUN and EVAL go where INIT went.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rollserve.contract import STAGES, NodeStatus, Stage


@dataclass
class ClusterNode:
    """One worker on one node (a node whose worker died and was started again is a new
    ``ClusterNode``: the next ``generation``)."""

    name: str
    node_id: str
    slots: int
    actor: Any  # the worker's ray ActorHandle (untyped in ray)
    generation: int = 1
    alive: bool = True
    draining: bool = False
    hosted: set[str] = field(default_factory=set)
    busy: dict[Stage, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    done: dict[Stage, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    placed: int = 0
    lost: int = 0
    sandboxes_open: int = 0
    reaped_at_start: int = 0
    unanswered: int = 0  # status polls in a row its worker did not answer
    answered_at: float = 0.0  # (time.monotonic) when an exchange (``cluster.link``) was last answered
    reported_at: float = 0.0  # ... and its last status report

    @property
    def key(self) -> str:
        return f"{self.node_id}:{self.generation}"

    @property
    def free(self) -> int:
        return self.slots - len(self.hosted) if self.alive and not self.draining else 0

    def snapshot(self, queued: int) -> NodeStatus:
        return NodeStatus(
            name=self.name,
            node_id=self.node_id,
            alive=self.alive,
            draining=self.draining,
            slots=self.slots,
            hosted=len(self.hosted),
            queued=queued,
            busy=dict(self.busy),
            done=dict(self.done),
            placed=self.placed,
            lost=self.lost,
            sandboxes_open=self.sandboxes_open,
            reaped_at_start=self.reaped_at_start,
        )


class Placement:
    """Workers by key (node id and generation), and the wait for a free slot."""

    def __init__(self) -> None:
        self.nodes: dict[str, ClusterNode] = {}
        self.waiting = 0
        self._changed = asyncio.Condition()

    def add(self, node: ClusterNode) -> None:
        self.nodes[node.key] = node

    def current(self, node_id: str) -> ClusterNode | None:
        """The newest worker on the node ``node_id`` (alive or not), if any."""
        mine = [n for n in self.nodes.values() if n.node_id == node_id]
        return max(mine, key=lambda n: n.generation) if mine else None

    def by_name(self, name: str) -> list[ClusterNode]:
        return [n for n in self.nodes.values() if n.name == name]

    def _best(self) -> ClusterNode | None:
        free = [n for n in self.nodes.values() if n.free > 0]
        if not free:
            return None
        return min(free, key=lambda n: (len(n.hosted) / n.slots, n.placed))

    async def place(self, rollout_id: str) -> ClusterNode:
        """The node the rollout goes to, once one has a free slot (the caller bounds
        the wait: the rollout's deadline); a cancel while waiting takes no slot."""
        async with self._changed:
            self.waiting += 1
            try:
                node = self._best()
                while node is None:
                    await self._changed.wait()
                    node = self._best()
            finally:
                self.waiting -= 1
            node.hosted.add(rollout_id)
            node.placed += 1
            return node

    async def changed(self) -> None:
        """Wake the placements waiting: a slot came free, a node joined or changed."""
        async with self._changed:
            self._changed.notify_all()

    def statuses(self) -> list[NodeStatus]:
        return [n.snapshot(self.waiting) for n in sorted(self.nodes.values(), key=lambda n: (n.name, not n.alive))]

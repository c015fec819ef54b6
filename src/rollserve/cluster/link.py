"""The head's batched traffic with one node's worker (``NodeLink``).

A Ray actor call costs the head's process CPU of its own (building and pickling the
call, Ray's submission and reply threads, an object ref and its future), much more
than a math rollout's own work there. So the head does not make one call per stage and
one per cleanup: requests to a node wait ``BATCH_S`` in its outbox and go as one
``submit`` call (while one is on its way, the next batch gathers until it is delivered,
``HOLD_S`` at most, so a busy node gets fewer, larger batches), and one poll at a time
(``take_replies``) takes every answer the worker has ready. Each request still has its
own answer and its own waiter here; the pipeline sees a stage call as before.

Failures keep their meaning: a failed ``submit`` fails the requests it carried, a failed
poll every request waiting, with Ray's own error (the executor maps it, a dead worker to
``NodeLost`` as before); a node the head counts dead ends its waiters with ``LinkClosed``.
A request cancelled before its batch left is never sent; one already sent runs on the
node until the attempt's cleanup ends it (the worker refuses the stages of an attempt it
cleaned up). Every wait is bounded: ``submit`` by ``call_timeout``, a poll by its wait
plus ``call_timeout`` (a poll unanswered in time is asked again: the worker keeps its
answers until a poll acknowledges them); a waiter by the caller's deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle

from ray.exceptions import RayError

from rollserve.cluster.nodes import ClusterNode
from rollserve.cluster.protocol import LinkItem, LinkReply, StageCall, StageOutcome

log = logging.getLogger(__name__)

BATCH_S = 0.002  # how long a request waits for others to share its ``submit`` call
HOLD_S = 0.05  # ... while another batch is on its way to the node (sent when that one arrives)
POLL_WAIT_S = 2.0  # how long one poll waits on the worker for an answer


class LinkClosed(Exception):
    """The node is lost to the head: its requests will not be answered."""


class WorkerFailed(RayError):
    """The worker could not answer a request (its reply names why)."""


class NodeLink:
    """Requests to one node's worker and their answers, in batches."""

    def __init__(self, node: ClusterNode, call_timeout: float) -> None:
        self.node = node
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._outbox: list[LinkItem] = []
        self._waiting: dict[int, asyncio.Future[StageOutcome | None]] = {}
        self._ack = 0  # the last reply seq taken
        self._told = 0  # the last ack the worker was told
        self._flush: asyncio.Handle | None = None
        self._poller: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # submits under way
        self._closed: LinkClosed | None = None
        self.calls = 0  # Ray calls made (submits and polls)
        self.requests = 0  # requests sent

    async def stage(self, call: StageCall) -> StageOutcome:
        outcome = await self._request(LinkItem(id=next(self._ids), call=call))
        if outcome is None:
            raise WorkerFailed(f"node {self.node.name} answered a {call.stage} call with nothing")
        return outcome

    async def cleanup(self, rollout_id: str, attempt: int, produced: bool) -> StageOutcome | None:
        return await self._request(LinkItem(id=next(self._ids), cleanup=(rollout_id, attempt, produced)))

    async def _request(self, item: LinkItem) -> StageOutcome | None:
        if self._closed is not None:
            raise self._closed
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[StageOutcome | None] = loop.create_future()
        self._waiting[item.id] = waiter
        self._outbox.append(item)
        if self._flush is None:
            self._flush = loop.call_later(HOLD_S if self._tasks else BATCH_S, self._send)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name=f"rollserve-link-{self.node.name}")
        try:
            return await waiter
        finally:
            self._waiting.pop(item.id, None)
            if item in self._outbox:  # cancelled before its batch left: never sent
                self._outbox.remove(item)

    def _send(self) -> None:
        self._flush = None
        items, self._outbox = self._outbox, []
        if items:
            task = asyncio.create_task(self._submit(items))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _submit(self, items: list[LinkItem]) -> None:
        self.calls += 1
        self.requests += len(items)
        # Pickled here, by the C pickler, into one bytes argument: Ray's own pickler
        # (cloudpickle) takes about twice the CPU for the same objects.
        payload = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            await asyncio.wait_for(self.node.actor.submit.remote(payload), self.call_timeout)
        except TimeoutError:  # maybe delivered: its answers may still come; else the deadlines end them
            log.warning("node %s: a batch of %d requests was not acknowledged in time", self.node.name, len(items))
        except Exception as exc:  # not delivered (or the worker is gone): those requests fail
            self._fail(exc, [item.id for item in items])
        finally:
            if self._outbox and self._closed is None:  # gathered while this one was on its way
                if self._flush is not None:
                    self._flush.cancel()
                self._flush = asyncio.get_running_loop().call_soon(self._send)

    def _pending(self) -> list[int]:
        return [i for i, waiter in self._waiting.items() if not waiter.done()]

    async def _poll(self) -> None:
        """Take answers while requests wait; then acknowledge the last ones taken (the
        worker drops them). No await between the last look and the return: a request
        made after it starts a new poller."""
        while self._closed is None:
            if self._pending():
                await self._take(POLL_WAIT_S)
            elif self._ack > self._told:
                if not await self._take(0.0):
                    return
            else:
                return

    async def _take(self, wait: float) -> bool:
        """One poll: hand each answer to its waiter. False when it failed."""
        self.calls += 1
        self._told = ack = self._ack
        try:
            replies: list[LinkReply] = await asyncio.wait_for(
                self.node.actor.take_replies.remote(ack, wait), wait + self.call_timeout
            )
        except TimeoutError:
            log.warning("node %s: a poll for answers was not answered in time; asking again", self.node.name)
            return False
        except Exception as exc:  # Ray's error (the executor maps it), or a bug: never a hang
            self._fail(exc, self._pending())
            return False
        for reply in replies:
            self._ack = max(self._ack, reply.seq)
            waiter = self._waiting.get(reply.id)
            if waiter is None or waiter.done():
                continue  # a request no one waits for any more (cancelled, or a reply sent again)
            if reply.error is not None:
                waiter.set_exception(WorkerFailed(f"node {self.node.name}: {reply.error}"))
            else:
                waiter.set_result(reply.outcome)
        return True

    def _fail(self, exc: BaseException, ids: list[int]) -> None:
        for request_id in ids:
            waiter = self._waiting.get(request_id)
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    def close(self, why: str) -> None:
        """The node is lost: every request waiting ends (``LinkClosed``), none is sent."""
        if self._closed is not None:
            return
        self._closed = LinkClosed(f"node {self.node.name} was lost: {why}")
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._outbox.clear()
        self._fail(self._closed, list(self._waiting))
        for task in (self._poller, *self._tasks):
            if task is not None:
                task.cancel()

    async def aclose(self) -> None:
        """Close, and wait (bounded) for its own tasks to end."""
        self.close("the head is stopping")
        tasks = [t for t in (self._poller, *self._tasks) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.call_timeout)

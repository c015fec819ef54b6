"""The head's batched traffic with one node's worker (``NodeLink``).

A Ray actor call costs the head's process CPU of its own (building and pickling the
call, Ray's submission and reply threads, an object ref and its future), much more
than a math rollout's own work there. So the head does not make one call per stage and
one per cleanup. Each Ray call is an ``exchange``: it delivers the requests gathered
in the node's outbox (for ``BATCH_S``). One exchange at a time waits on the worker for
the next answer and takes every answer it has ready (a poll; an exchange that only
delivers takes none, so each answer crosses once); the next poll
leaves ``BATCH_S`` after the last one came back, carrying the requests its answers led
to (a rollout's next stage, its cleanup), so a request costs at most about one call and
requests that come together share one. A request made while the poll waits goes in an
exchange of its own (while one such is on its way, the next ones gather until it is
back, ``HOLD_S`` at most). Each request has its own answer and its own waiter here; the
pipeline sees a stage call as before.

Failures keep their meaning: a failed exchange fails the requests it carried, with Ray's
own error (the executor maps it, a dead worker to ``NodeLost`` as before); the others
wait on for the next poll (a request that cannot be pickled fails alone, unsent). A
poll that finds the worker dead or unreachable (``RayActorError``), or
``MAX_FAILED_POLLS`` failed polls in a row, fails every request waiting; a node the
head counts dead ends its waiters with ``LinkClosed``.
A request cancelled before its batch left is never sent; one already sent runs on the
node until the attempt's cleanup ends it (the worker refuses the stages of an attempt it
cleaned up). Every wait is bounded: an exchange by its wait plus ``call_timeout`` (a
poll unanswered in time is asked again: the worker keeps its answers until an exchange
acknowledges them); a waiter by the caller's deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import time
from collections.abc import Coroutine
from typing import Any

from ray.exceptions import RayActorError, RayError

from rollserve.cluster.nodes import ClusterNode
from rollserve.cluster.protocol import LinkItem, LinkReply, StageCall, StageOutcome

log = logging.getLogger(__name__)

BATCH_S = 0.005  # how long a request waits for others to share its exchange
HOLD_S = 0.05  # ... while the poll waits and another exchange is on its way (sent when it is back)
POLL_WAIT_S = 2.0  # how long one poll waits on the worker for an answer
FAILED_POLL_S = 0.25  # the next poll after one that failed leaves this much later
MAX_FAILED_POLLS = 3  # polls failed in a row: then every request waiting fails


class LinkClosed(Exception):
    """The node is lost to the head: its requests will not be answered."""


class WorkerFailed(RayError):
    """The worker could not answer a request (its reply names why)."""


class NodeLink:
    """Requests to one node's worker and their answers, in batches (``exchange`` calls)."""

    def __init__(self, node: ClusterNode, call_timeout: float) -> None:
        self.node = node
        self.call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._outbox: list[LinkItem] = []
        self._waiting: dict[int, asyncio.Future[StageOutcome | None]] = {}
        self._ack = 0  # the last reply seq taken
        self._told = 0  # the last ack the worker was told
        self._flush: asyncio.Handle | None = None  # the next ``_send`` (uvloop: a Handle at delay 0)
        self._flush_at = 0.0  # ... due then (loop time)
        self._polling = False  # an exchange that waits for answers is on its way
        self._sending = 0  # exchanges that only deliver requests, on their way
        self._failed_polls = 0  # polls failed in a row
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed: LinkClosed | None = None
        self.calls = 0  # Ray calls made
        self.requests = 0  # requests sent
        self.polls = 0  # of the calls: those that waited for answers
        self.answers = 0  # answers taken
        self.unused = 0  # ... of them: one already taken (sent again), or no one waits for any more

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
        waiter: asyncio.Future[StageOutcome | None] = asyncio.get_running_loop().create_future()
        self._waiting[item.id] = waiter
        self._outbox.append(item)
        self._schedule(HOLD_S if self._polling and self._sending else BATCH_S)
        try:
            return await waiter
        finally:
            self._waiting.pop(item.id, None)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # taken: an answer that came as its caller was cancelled
            if item in self._outbox:  # cancelled before its batch left: never sent
                self._outbox.remove(item)

    def _schedule(self, delay: float) -> None:
        """Send (``_send``) within ``delay`` seconds (sooner if already due sooner)."""
        if self._closed is not None:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if self._flush is not None:
            if self._flush_at <= due:
                return
            self._flush.cancel()
        self._flush, self._flush_at = loop.call_later(delay, self._send), due

    def _pending(self) -> list[int]:
        return [i for i, waiter in self._waiting.items() if not waiter.done()]

    def _send(self) -> None:
        """The next exchange: one that waits for answers when none is on its way and a
        request waits (it carries the outbox); else the outbox alone; else, when nothing
        waits, the acknowledgement of the answers taken (the worker drops them)."""
        self._flush = None
        if self._closed is not None:
            return
        items, self._outbox = self._outbox, []
        if not self._polling and self._pending():
            self._polling = True
            self._start(self._exchange(items, POLL_WAIT_S))
        elif items:
            self._sending += 1
            self._start(self._exchange(items, 0.0))
        elif not self._polling and self._ack > self._told:
            self._sending += 1
            self._start(self._exchange([], 0.0))

    def _start(self, exchange: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(exchange)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _exchange(self, items: list[LinkItem], wait: float) -> None:
        """One ``exchange`` call: deliver ``items`` and take the answers ready (``wait``:
        for up to that long, for the first). Bounded by ``wait + call_timeout``."""
        self.calls += 1
        self.polls += wait > 0
        self._told = ack = self._ack
        replies: list[LinkReply] = []
        try:
            payload = self._payload(items)
            self.requests += len(items)
            replies = await asyncio.wait_for(
                self.node.actor.exchange.remote(payload, ack, wait), wait + self.call_timeout
            )
        except TimeoutError:  # maybe delivered: its answers come with a later exchange (or deadlines end them)
            log.warning("node %s: an exchange of %d requests was not answered in time", self.node.name, len(items))
        except Exception as exc:  # Ray's error (the executor maps it), or a bug: never a hang
            self._failed(exc, items, wait)
        else:
            self.node.answered_at = time.monotonic()  # it answers: no status poll needed (``NodeWatch``)
            if wait > 0:
                self._failed_polls = 0
        finally:
            if wait > 0:
                self._polling = False
            else:
                self._sending -= 1
        self._hand(replies)
        if wait > 0:  # the next poll, carrying the requests these answers lead to
            self._schedule(FAILED_POLL_S if self._failed_polls else BATCH_S)
        elif self._outbox:  # gathered while this one was on its way
            self._schedule(0.0)

    def _payload(self, items: list[LinkItem]) -> bytes | None:
        """The requests, pickled here by the C pickler into one bytes argument (Ray's own,
        cloudpickle, takes about twice the CPU for the same objects). A request that
        cannot be pickled fails alone (``WorkerFailed``, never sent); the rest go."""
        if not items:
            return None
        try:
            return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # (RecursionError, PicklingError, TypeError, ...): find which
            pass
        for item in list(items):
            try:
                pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                items.remove(item)
                why = f"node {self.node.name}: a request could not be sent: {type(exc).__name__}: {str(exc)[:200]}"
                self._fail(WorkerFailed(why), [item.id])
        return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL) if items else None

    def _failed(self, exc: Exception, items: list[LinkItem], wait: float) -> None:
        """A failed exchange fails the requests it carried. The others wait on: their
        answers stay on the worker until acknowledged, so the next poll takes them; but
        a poll that finds the worker dead or unreachable (``RayActorError``: the
        executor counts the node dead or unanswered), or ``MAX_FAILED_POLLS`` polls
        failed in a row, fails every request waiting here (none will be answered)."""
        if wait > 0:
            self._failed_polls += 1
        if wait > 0 and (isinstance(exc, RayActorError) or self._failed_polls >= MAX_FAILED_POLLS):
            log.warning("node %s: exchange failed (%s): every request waiting fails", self.node.name, exc)
            self._fail(exc, self._pending())
            self._failed_polls = 0
        else:
            log.warning("node %s: an exchange of %d requests failed: %s", self.node.name, len(items), exc)
            self._fail(exc, [item.id for item in items])

    def _hand(self, replies: list[LinkReply]) -> None:
        self.answers += len(replies)
        for reply in replies:
            self._ack = max(self._ack, reply.seq)
            waiter = self._waiting.get(reply.id)
            if waiter is None or waiter.done():
                self.unused += 1
                continue  # a request no one waits for any more (cancelled, or a reply sent again)
            if reply.error is not None:
                waiter.set_exception(WorkerFailed(f"node {self.node.name}: {reply.error}"))
            else:
                waiter.set_result(reply.outcome)

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
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """Close, and wait (bounded) for its own tasks to end."""
        self.close("the head is stopping")
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.call_timeout)

"""What every scripted inference-server double shares (vLLM, SGLang, llama.cpp).

A double answers with scripted replies tokenized by a real chat tokenizer, holds
calls in ``capacity`` slots for ``latency`` seconds (like a GPU server's batch),
fails on demand (``fail_next``), can be paused and resumed like a server around a
weight update, and records every call, so a test can prove that what reached the
trainer is exactly what was "sampled". Subclasses only speak a wire format.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from rollserve.llm.tokens import DEFAULT_TOKENIZER, ChatTokenizer
from rollserve.testing.load_meter import LoadMeter

ReplyFn = Callable[[list[int], str], "str | Awaitable[str]"]
LatencyFn = Callable[[list[int], list[int]], float]


def fake_logprob(prompt_ids: Sequence[int], position: int, seed: int | None = None, weights: str = "") -> float:
    """The logprob every fake server reports for output position ``position`` after ``prompt_ids``.

    Deterministic (a hash of the prompt, the position, the seed and the weights loaded
    at run time, if any), negative, and exactly representable through JSON, so tests
    can compare floats with ``==``.
    """
    return fake_logprobs(prompt_ids, position + 1, seed, weights)[position]


def fake_logprobs(prompt_ids: Sequence[int], count: int, seed: int | None = None, weights: str = "") -> list[float]:
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids))
    h.update(b"seed:" + str(seed).encode())
    if weights:  # new weights make other logprobs (the weights as started add nothing)
        h.update(b"weights:" + weights.encode())
    digest = h.digest()
    out = []
    for pos in range(count):
        raw = hashlib.blake2b(digest + pos.to_bytes(8, "little"), digest_size=8).digest()
        unit = int.from_bytes(raw, "little") / 2**64  # [0, 1)
        out.append(-round(0.001 + 6.0 * unit, 6))  # in (-6.001, -0.001]
    return out


@dataclass
class RecordedCall:
    """One generation request and what the server answered."""

    index: int
    request: dict[str, Any]
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: int | None = None
    failure: str | None = None  # "error" | "hang" | "close" when scripted to fail
    received_at: float = 0.0
    started_at: float | None = None  # got a slot
    finished_at: float | None = None
    route: str = ""


@dataclass
class Sampled:
    output_ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" | "length" | "abort"
    stop_token: int | None  # the stop token that ended it (None: eos, length or abort)


class FakeServer:
    """Scripted server core; see the module docstring. Subclasses add ``routes``.

    replies: text cycled call by call, or ``fn(prompt_ids, prompt_text) -> str``
        (may be async). A reply is tokenized, cut at max_tokens (finish "length"),
        else ends with eos (finish "stop").
    latency: seconds a call holds its slot, or ``fn(prompt_ids, output_ids) -> s``.
    capacity: concurrent slots (None: unlimited); later calls queue.
    """

    thread_name = "fake-llm-server"

    def __init__(
        self,
        tokenizer: ChatTokenizer | str = DEFAULT_TOKENIZER,
        replies: str | Sequence[str] | ReplyFn = ("OK",),
        latency: float | LatencyFn = 0.0,
        model: str = "fake-model",
        capacity: int | None = None,
        max_model_len: int = 32768,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.tok = ChatTokenizer.load(tokenizer) if isinstance(tokenizer, str) else tokenizer
        if isinstance(replies, str):
            replies = [replies]
        if not callable(replies) and not replies:
            raise ValueError("replies: give at least one reply (or a callable)")
        self.replies = replies
        self.latency = latency
        self.model = model
        self.capacity = capacity
        self.max_model_len = max_model_len
        self.host = host
        self.port = port
        self.calls: list[RecordedCall] = []
        self.queued = 0
        self.paused = False
        self.pauses: list[str] = []  # modes of pause requests received, in order
        self._reply_cycle = itertools.count()
        self._failures: list[tuple[str, int]] = []  # (mode, status) for the next calls
        self._meter = LoadMeter()
        self._slots: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._aborts: set[asyncio.Event] = set()  # one per call in a slot
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        self._slots = asyncio.Semaphore(self.capacity) if self.capacity else None
        self._stopping = asyncio.Event()
        self._resumed = asyncio.Event()
        if not self.paused:  # (paused before the start: calls wait for resume())
            self._resumed.set()
        app = web.Application(client_max_size=256 * 1024**2)
        self.routes(app)
        # A short shutdown timeout: "hanging" handlers are released by close() anyway.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._meter.reset()
        return self

    async def close(self) -> None:
        """Stop a server started with ``start()`` / ``async with`` (drops connections)."""
        if self._stopping is not None:
            self._stopping.set()  # releases "hanging" handlers
        if self._resumed is not None:
            self._resumed.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def kill(self) -> None:
        """Stop as a crashed server does: every connection dropped at once, requests in
        flight unanswered, nothing listening any more."""
        if self._runner is None:
            return
        server = self._runner.server
        for site in list(self._runner.sites):
            await site.stop()  # stop listening first: nothing new gets in
        if server is not None:
            for handler in server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
        await self.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_in_thread(self, timeout: float = 30.0) -> Self:
        """Run the server on its own event loop in a daemon thread (for sync code)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve_forever() -> None:
            loop = asyncio.new_event_loop()
            self._thread_loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # report start-up failures to the caller
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{type(self).__name__} did not start in time")
        if errors:
            self._thread = None
            raise errors[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with ``start_in_thread()``."""
        if self._thread is None or self._thread_loop is None:
            raise RuntimeError("not running in a thread; use 'await server.close()'")
        self._thread_loop.call_soon_threadsafe(self._thread_loop.stop)
        self._thread.join(timeout)
        self._thread = None
        self._thread_loop = None

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting, pausing and reading results ----------------------------------
    def fail_next(self, count: int = 1, mode: str = "error", status: int = 500) -> None:
        """Make the next ``count`` generation calls fail.

        mode ``error``: answer ``status`` with the server's error body;
        ``hang``: never answer (until the server stops or the client gives up);
        ``close``: drop the connection without an answer.
        """
        if mode not in ("error", "hang", "close"):
            raise ValueError(f"mode: expected error, hang or close, got {mode!r}")
        self._failures.extend([(mode, status)] * count)

    def pause(self, mode: str = "abort") -> None:
        """Hold new calls until ``resume()``; mode ``abort`` also ends those in a slot
        at once with finish reason "abort" and the tokens sampled so far (as vLLM 0.32
        does: HTTP 200, a partial reply)."""
        self.pauses.append(mode)
        self.paused = True
        if self._resumed is not None:
            self._resumed.clear()
        if mode == "abort":
            for event in list(self._aborts):
                event.set()

    def resume(self) -> None:
        self.paused = False
        if self._resumed is not None:
            self._resumed.set()

    def stats(self) -> dict[str, float | None]:
        """Load figures since start (or ``reset_stats``), for benchmarks."""
        snap = self._meter.snapshot()
        wall = snap["wall_seconds"] or 1e-9
        return {
            **snap,
            "requests": len(self.calls),
            "queued": self.queued,
            "capacity": self.capacity,
            "busy_fraction": snap["busy_seconds"] / wall,
            "utilization": snap["slot_seconds"] / (wall * self.capacity) if self.capacity else None,
        }

    def reset_stats(self) -> None:
        """Start a new measuring window (requests in flight stay counted)."""
        self._meter.reset(in_flight=self._meter.in_flight)

    # --- one generation call ---------------------------------------------------------
    def record(self, route: str, body: dict[str, Any]) -> RecordedCall:
        call = RecordedCall(
            index=len(self.calls), request=body, prompt_ids=[], received_at=time.perf_counter(), route=route
        )
        self.calls.append(call)
        return call

    def take_failure(self, call: RecordedCall) -> int | None:
        """The status to fail this call with, if one was scripted (sets ``call.failure``)."""
        if not self._failures:
            return None
        call.failure, status = self._failures.pop(0)
        return status

    async def run(
        self,
        call: RecordedCall,
        prompt_ids: list[int],
        max_tokens: int,
        stop_ids: set[int],
        ignore_eos: bool = False,
        seed: int | None = None,
        weights: str = "",
    ) -> Sampled:
        """Wait out a pause, take a slot, "sample", hold the slot for the latency;
        ``weights`` names the weights loaded at run time that sample (see ``fake_logprobs``)."""
        call.prompt_ids = prompt_ids
        assert self._resumed is not None
        await self._resumed.wait()
        self.queued += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self.queued -= 1
        self._meter.enter()
        call.started_at = time.perf_counter()
        abort = asyncio.Event()
        self._aborts.add(abort)
        try:
            sampled = await self.sample(prompt_ids, max_tokens, stop_ids, ignore_eos, seed, weights)
            delay = self.latency(prompt_ids, sampled.output_ids) if callable(self.latency) else self.latency
            slot_start = time.perf_counter()
            if delay > 0 and not abort.is_set():
                waiter = asyncio.ensure_future(abort.wait())
                try:
                    await asyncio.wait([waiter], timeout=delay)
                finally:
                    waiter.cancel()
            if abort.is_set():  # as vLLM: the tokens sampled so far, finish "abort"
                done = (time.perf_counter() - slot_start) / delay if delay > 0 else 0.0
                keep = min(len(sampled.output_ids) - 1, int(len(sampled.output_ids) * done))
                keep = max(keep, 0)
                sampled = Sampled(sampled.output_ids[:keep], sampled.logprobs[:keep], "abort", None)
        finally:
            self._aborts.discard(abort)
            self._meter.leave()
            if self._slots is not None:
                self._slots.release()
        call.output_ids, call.logprobs, call.finish_reason = (sampled.output_ids, sampled.logprobs, sampled.finish)
        call.status, call.finished_at = 200, time.perf_counter()
        return sampled

    async def sample(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        stop_ids: set[int],
        ignore_eos: bool = False,
        seed: int | None = None,
        weights: str = "",
    ) -> Sampled:
        """The scripted reply as ids: cut at a stop token, at max_tokens, or + eos."""
        if callable(self.replies):
            text = self.replies(prompt_ids, self.tok.decode(prompt_ids))
            if inspect.isawaitable(text):
                text = await text
        else:
            text = self.replies[next(self._reply_cycle) % len(self.replies)]
        ids = self.tok.encode(text)
        eos = self.tok.eos_token_id
        stops = set(stop_ids)
        if not ignore_eos:
            stops.add(eos)
        out, finish, stop_token = ids + [eos], "stop", None
        for i, token in enumerate(ids[:max_tokens]):
            if token in stops:  # a reply may itself contain a stop token
                out, stop_token = ids[: i + 1], (None if token == eos else token)
                break
        else:
            if len(ids) >= max_tokens:
                out, finish = ids[:max_tokens], "length"
        return Sampled(out, fake_logprobs(prompt_ids, len(out), seed, weights), finish, stop_token)

    async def fail(
        self, request: web.Request, call: RecordedCall, status: int, error: Callable[[int, str], web.Response]
    ) -> web.StreamResponse:
        """Answer a call scripted to fail (``error`` builds the server's error body)."""
        call.finished_at = time.perf_counter()
        if call.failure == "error":
            call.status = status
            return error(status, "scripted failure")
        if call.failure == "hang":
            assert self._stopping is not None
            await self._stopping.wait()
        # "close" (and a hang released by close): drop the connection, answer nothing.
        if request.transport is not None:
            request.transport.close()
        raise asyncio.CancelledError()


async def read_json(request: web.Request, error: Callable[[int, str], web.Response]) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the 400 answer to send instead."""
    try:
        body = await request.json()
    except ValueError:
        return error(400, "the body is not valid JSON")
    if not isinstance(body, dict):
        return error(400, "the body must be a JSON object")
    return body

"""A scripted, vLLM-compatible HTTP server: test handlers and benchmarks without a GPU.

It speaks the subset of vLLM's OpenAI server that rollserve uses (token-id prompts on
``/v1/completions`` with ``return_token_ids`` and ``logprobs``, ``/tokenize``,
``/v1/models``, ``/health``) and answers with scripted replies, tokenized with a real
chat tokenizer. Every call is recorded (prompt ids, sampled ids, logprobs), so a test
can prove that what reached the trainer is exactly what was "sampled".

    async with FakeVLLM(tokenizer, replies=["4", "done"], latency=0.01) as server:
        backend = VLLMBackend(server.url)

    server = FakeVLLM(tokenizer).start_in_thread()   # for sync code
    ...; server.stop()

``capacity`` limits concurrent "slots" like a GPU server's max batch: requests beyond
it queue. ``stats()`` reports the busy fraction (wall time with at least one request
in a slot) and utilization (slot-seconds / (wall x capacity)).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from aiohttp import web

from rollserve.llm.tokenizer import ChatTokenizer
from rollserve.testing.load_meter import LoadMeter
from rollserve.testing.vllm_wire import (
    completion_body,
    error_response,
    fake_logprob,
    fake_logprobs,
    json_body,
    parse_prompt,
)

__all__ = ["FakeVLLM", "RecordedCall", "fake_logprob", "main"]

ReplyFn = Callable[[list[int], str], "str | Awaitable[str]"]
LatencyFn = Callable[[list[int], list[int]], float]


@dataclass
class RecordedCall:
    """One ``/v1/completions`` request and what the server answered."""

    index: int
    request: dict
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: int | None = None
    failure: str | None = None  # "error" | "hang" | "close" when scripted to fail
    received_at: float = 0.0
    started_at: float | None = None  # got a slot
    finished_at: float | None = None


class FakeVLLM:
    """A scripted vLLM look-alike; see the module docstring.

    tokenizer: a ChatTokenizer or a source for ``ChatTokenizer.load``.
    replies: text cycled call by call, or ``fn(prompt_ids, prompt_text) -> str``
        (may be async). A reply is tokenized, cut at max_tokens (finish "length"),
        else ends with eos (finish "stop").
    latency: seconds a call holds its slot, or ``fn(prompt_ids, output_ids) -> s``.
    capacity: concurrent slots (None: unlimited); later calls queue.
    return_token_ids_supported: False imitates a server that ignores
        ``return_token_ids`` (ids only as "token_id:N" strings).
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer | str = "smollm2",
        replies: str | Sequence[str] | ReplyFn = ("OK",),
        latency: float | LatencyFn = 0.0,
        model: str = "fake-model",
        capacity: int | None = None,
        max_model_len: int = 32768,
        return_token_ids_supported: bool = True,
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
        self.return_token_ids_supported = return_token_ids_supported
        self.host = host
        self.port = port
        self.calls: list[RecordedCall] = []
        self.queued = 0
        self._reply_cycle = itertools.count()
        self._failures: list[tuple[str, int]] = []  # (mode, status) for the next calls
        self._meter = LoadMeter()
        self._slots: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "FakeVLLM":
        self._slots = asyncio.Semaphore(self.capacity) if self.capacity else None
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        # A short shutdown timeout: "hanging" handlers are released by close() anyway.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._meter.reset()
        return self

    async def close(self) -> None:
        """Stop a server started with ``start()`` / ``async with``."""
        if self._stopping is not None:
            self._stopping.set()  # releases "hanging" handlers
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "FakeVLLM":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_in_thread(self, timeout: float = 30.0) -> "FakeVLLM":
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

        self._thread = threading.Thread(target=serve_forever, name="fake-vllm", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("fake vLLM server did not start in time")
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

    def __enter__(self) -> "FakeVLLM":
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting failures and reading results --------------------------------
    def fail_next(self, count: int = 1, mode: str = "error", status: int = 500) -> None:
        """Make the next ``count`` completion calls fail.

        mode ``error``: answer ``status`` with a vLLM-style error body;
        ``hang``: never answer (until the server stops or the client gives up);
        ``close``: drop the connection without an answer.
        """
        if mode not in ("error", "hang", "close"):
            raise ValueError(f"mode: expected error, hang or close, got {mode!r}")
        self._failures.extend([(mode, status)] * count)

    def stats(self) -> dict:
        """Load figures since start (or ``reset_stats``), for benchmarks."""
        snap = self._meter.snapshot()
        wall = snap["wall_seconds"] or 1e-9
        snap["requests"] = len(self.calls)
        snap["queued"] = self.queued
        snap["capacity"] = self.capacity
        snap["busy_fraction"] = snap["busy_seconds"] / wall
        snap["utilization"] = (
            snap["slot_seconds"] / (wall * self.capacity) if self.capacity else None
        )
        return snap

    def reset_stats(self) -> None:
        """Start a new measuring window (requests in flight stay counted)."""
        self._meter.reset(in_flight=self._meter.in_flight)

    # --- routes ----------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            text = self.tok.render(
                body["messages"],
                add_generation_prompt=body.get("add_generation_prompt", True),
                tools=body.get("tools"),
            )
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return error_response(400, "give 'prompt' (a string) or 'messages'")
        tokens = self.tok.encode(text)
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
             "token_strs": None}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        call = RecordedCall(
            index=len(self.calls), request=body, prompt_ids=[], received_at=time.perf_counter()
        )
        self.calls.append(call)
        prompt_ids = parse_prompt(body.get("prompt"), self.tok)
        max_tokens = body.get("max_tokens") or 16  # vLLM's default for completions
        if prompt_ids is None:
            return self._reject(call, "prompt: expected a string, a list of token ids, or [[ids]]")
        call.prompt_ids = prompt_ids
        if len(prompt_ids) + max_tokens > self.max_model_len:
            return self._reject(
                call,
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + max_tokens} tokens "
                f"({len(prompt_ids)} in the messages, {max_tokens} in the completion).",
            )
        if self._failures:
            call.failure, status = self._failures.pop(0)
            return await self._fail(request, call, status)

        self.queued += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self.queued -= 1
        self._meter.enter()
        call.started_at = time.perf_counter()
        try:
            output_ids, finish, stop_reason = await self._sample(prompt_ids, body, max_tokens)
            delay = self.latency(prompt_ids, output_ids) if callable(self.latency) else self.latency
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self._meter.leave()
            if self._slots is not None:
                self._slots.release()
        logprobs = fake_logprobs(prompt_ids, len(output_ids), body.get("seed"))
        call.output_ids, call.logprobs, call.finish_reason = output_ids, logprobs, finish
        call.status, call.finished_at = 200, time.perf_counter()
        return web.json_response(completion_body(
            self.tok, body, self.model, prompt_ids, output_ids, logprobs, finish, stop_reason,
            return_token_ids_supported=self.return_token_ids_supported,
        ))

    # --- helpers -----------------------------------------------------------------
    def _reject(self, call: RecordedCall, message: str) -> web.Response:
        call.status, call.finished_at = 400, time.perf_counter()
        return error_response(400, message)

    async def _sample(
        self, prompt_ids: list[int], body: dict, max_tokens: int
    ) -> tuple[list[int], str, int | None]:
        """The scripted reply as ids: cut at a stop token, at max_tokens, or + eos."""
        if callable(self.replies):
            text = self.replies(prompt_ids, self.tok.decode(prompt_ids))
            if inspect.isawaitable(text):
                text = await text
        else:
            text = self.replies[next(self._reply_cycle) % len(self.replies)]
        ids = self.tok.encode(text)
        eos = self.tok.eos_token_id
        stops = set(body.get("stop_token_ids") or ())
        if not body.get("ignore_eos"):
            stops.add(eos)
        for i, token in enumerate(ids[:max_tokens]):
            if token in stops:  # a reply may itself contain a stop token
                return ids[: i + 1], "stop", (None if token == eos else token)
        if len(ids) >= max_tokens:
            return ids[:max_tokens], "length", None
        return ids + [eos], "stop", None

    async def _fail(self, request: web.Request, call: RecordedCall, status: int) -> web.StreamResponse:
        call.finished_at = time.perf_counter()
        if call.failure == "error":
            call.status = status
            return error_response(status, "scripted failure", kind="InternalServerError")
        if call.failure == "hang":
            assert self._stopping is not None
            await self._stopping.wait()
        # "close" (and a hang released by close): drop the connection, answer nothing.
        if request.transport is not None:
            request.transport.close()
        raise asyncio.CancelledError()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rollserve.testing.fake_vllm",
        description="A scripted vLLM-compatible server (no GPU, no model).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    parser.add_argument("--reply", nargs="+", default=["OK"], help="replies, cycled")
    parser.add_argument("--tokenizer", default="smollm2", help="folder, .gguf, or smollm2")
    parser.add_argument("--model", default="fake-model", help="served model name")
    parser.add_argument("--capacity", type=int, default=None, help="concurrent slots")
    args = parser.parse_args(argv)
    server = FakeVLLM(
        args.tokenizer, replies=args.reply, latency=args.latency, model=args.model,
        capacity=args.capacity, host=args.host, port=args.port,
    )

    async def serve() -> None:
        async with server:
            print(f"fake vLLM serving {args.model!r} on {server.url}", flush=True)
            await asyncio.Event().wait()  # until Ctrl-C / SIGTERM

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

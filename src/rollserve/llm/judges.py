"""Judges: model endpoints the service calls at EVAL to grade rollouts, never the policy.

A judge is an LLM backend kept out of the router: the router never samples it for a
policy call, the policy's pause, resume and weight loads never reach it, and the
policy's traffic never reaches its URL. Each judge has its own concurrency limit
(a semaphore: later calls queue), a timeout per call, retries on retryable failures,
a health flag (the last call's outcome) and call counts and latencies for /metrics.

    rollserve serve --judge grader=http://host:8000/v1          an OpenAI-compatible chat API
    rollserve serve --judge grader=openai_chat=http://host:8000 the same
    rollserve serve --judge grader=embedded                     the in-process SmolLM2
    rollserve serve --judge '{"name": "grader", "backend": "http://host:8000",
                              "concurrency": 4, "timeout": 30, "retries": 1}'

A token-level backend (embedded, vLLM, ...) renders the judge's chat with the server's
tokenizer, so it must share the policy's tokenizer; any other model is reached as an
OpenAI-compatible chat API (``openai_chat``, the default for a bare URL).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollserve.contract import SamplingParams
from rollserve.errors import InfraError, JudgeRefused, context_window_error
from rollserve.llm.base import LLMBackend, LLMError, Message, Tokenizer

JUDGE_NAME = r"^[A-Za-z0-9._:@+-]+$"
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))


class JudgeError(InfraError):
    """A judge could not be reached (connection error, timeout, 5xx or 429 after its
    tries, or a 401, 403 or 404: a judge configured wrong): the rubric's ``on_failure``
    applies. A refusal of what the policy wrote is ``errors.JudgeRefused`` instead."""


REFUSED_STATUS = (400, 413, 422)  # the judge's server refused the request's content


class JudgeConfig(BaseModel):
    """One judge, as ``--judge`` gives it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=100, pattern=JUDGE_NAME)
    backend: str | dict[str, Any] = Field(
        ...,
        description="a backend spec (as --backend takes it); a bare http(s) URL is an "
        "OpenAI-compatible chat API (openai_chat)",
    )
    concurrency: int = Field(4, ge=1, le=1024, description="calls in flight at most")
    timeout: float = Field(60.0, gt=0, le=3600, description="seconds per call (each try)")
    retries: int = Field(1, ge=0, le=10, description="more tries after a retryable failure")
    max_tokens: int = Field(512, ge=1, le=32_768, description="the judge's reply, in tokens")
    max_reply_chars: int = Field(8000, ge=16, le=1_000_000, description="a longer reply is refused (never parsed)")
    temperature: float = Field(0.0, ge=0, le=2)


def parse_judge_spec(spec: str | dict[str, Any]) -> JudgeConfig:
    """``NAME=BACKEND`` or a JSON object; ``ValueError`` naming the field otherwise."""
    raw: Any = spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"judge: not valid JSON: {exc}") from None
        else:
            name, sep, backend = text.partition("=")
            if not sep or not backend:
                raise ValueError("judge: expected NAME=BACKEND (a URL, openai_chat=URL, embedded...) or a JSON object")
            raw = {"name": name, "backend": backend}
    try:
        config = JudgeConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "judge"
        raise ValueError(f"judge.{where}: {first['msg']}") from None
    if isinstance(config.backend, str) and config.backend.startswith(("http://", "https://")):
        config.backend = f"openai_chat={config.backend}"
    return config


def check_unique(names: Iterable[str]) -> None:
    """``ValueError`` naming the first judge name given twice (the one rule the
    server's config, ``--judge`` and ``Judges`` share)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two judges named {name!r}")
        seen.add(name)


@dataclass(frozen=True)
class JudgeReply:
    text: str
    seconds: float


class Judge:
    """One judge endpoint: its backend, concurrency limit, timeout, retries, health."""

    def __init__(self, config: JudgeConfig, backend: LLMBackend, tokenizer: Tokenizer | None):
        self.config = config
        self.name = config.name
        self.backend = backend
        self.tokenizer = tokenizer
        self._slots = asyncio.Semaphore(config.concurrency)
        self.in_flight = 0
        self.calls: dict[str, int] = {"ok": 0, "failed": 0, "timeout": 0, "refused": 0}
        self.healthy: bool | None = None  # None until the first call
        self.last_error: str | None = None
        self.unparsed = 0  # replies that held no valid score (counted by the handler)
        self._latency = [0] * len(BUCKETS)
        self._latency_sum = 0.0

    async def ask(self, messages: list[Message]) -> JudgeReply:
        """The judge's reply to ``messages``; ``JudgeError`` after its tries run out,
        ``JudgeRefused`` (never tried again) when it refused what the policy wrote."""
        began = time.monotonic()
        async with self._slots:
            self.in_flight += 1
            try:
                return await self._tries(messages, began)
            finally:
                self.in_flight -= 1

    async def _tries(self, messages: list[Message], began: float) -> JudgeReply:
        config = self.config
        problem = "no try"
        for _ in range(config.retries + 1):
            outcome = "failed"
            try:
                text = await asyncio.wait_for(self._call(messages), config.timeout)
            except TimeoutError:
                outcome, problem, retry = "timeout", f"no reply in {config.timeout:g} s", True
            except LLMError as exc:
                if exc.status in REFUSED_STATUS or context_window_error(exc) is not None:
                    # (a token-level judge's window: the prompt refused unsent, as a server would)
                    self._refused(began, f"the judge's server refused the prompt ({exc})")
                problem, retry = str(exc), exc.retryable
            else:
                if len(text) > config.max_reply_chars:
                    self._refused(
                        began, f"reply of {len(text)} characters is over max_reply_chars ({config.max_reply_chars})"
                    )
                self._observe("ok", time.monotonic() - began)
                return JudgeReply(text, time.monotonic() - began)
            self._observe(outcome, time.monotonic() - began)
            self.last_error = problem
            if not retry:
                break
        raise JudgeError(f"judge {self.name}: {problem}")

    def _refused(self, began: float, problem: str) -> NoReturn:
        """The judge answered, refusing what the policy wrote: not a failure of the
        judge (it stays healthy), and not tried again."""
        self._observe("refused", time.monotonic() - began)
        raise JudgeRefused(f"judge {self.name}: {problem}")

    async def _call(self, messages: list[Message]) -> str:
        sampling = SamplingParams(max_tokens=self.config.max_tokens, temperature=self.config.temperature)
        if not self.backend.trainable:  # message level: a chat API
            return (await self.backend.chat(messages, sampling)).content
        if self.tokenizer is None:
            raise LLMError(
                f"judge {self.name}: a token-level judge needs the server's tokenizer",
                backend=self.name,
                retryable=False,
            )
        builder = self.tokenizer.prompt_builder()
        ids = await builder.afirst(messages)
        generation = await self.backend.generate(ids, sampling)
        return await builder.aassistant_content(generation.output_ids, generation.finish_reason)

    def note_unparsed(self) -> None:
        self.unparsed += 1

    def _observe(self, outcome: str, seconds: float) -> None:
        self.calls[outcome] += 1
        self.healthy = outcome in ("ok", "refused")
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self._latency[i] += 1
        self._latency_sum += seconds

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend.describe(),
            "concurrency": self.config.concurrency,
            "in_flight": self.in_flight,
            "timeout": self.config.timeout,
            "retries": self.config.retries,
            "healthy": self.healthy,
            "calls": dict(self.calls),
            "unparsed": self.unparsed,
            "last_error": self.last_error,
        }


class Judges:
    """The server's judges, by name (the first is the default)."""

    def __init__(self, judges: list[Judge] | None = None) -> None:
        check_unique(judge.name for judge in judges or [])
        self._by_name: dict[str, Judge] = {judge.name: judge for judge in judges or []}

    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str | None) -> Judge:
        """The judge ``name`` (the first when None); KeyError when there is none."""
        if name is None:
            if not self._by_name:
                raise KeyError("the server has no judge (rollserve serve --judge NAME=URL)")
            return next(iter(self._by_name.values()))
        return self._by_name[name]

    def describe(self) -> list[dict[str, Any]]:
        return [judge.describe() for judge in self._by_name.values()]

    async def close(self) -> None:
        await asyncio.gather(*(j.backend.close() for j in self._by_name.values()), return_exceptions=True)

    def collect(self) -> Iterator[Metric]:
        """Calls by outcome, in flight, health and latency, per judge."""
        calls = CounterMetricFamily(
            "rollserve_judge_calls",
            "judge calls by outcome (ok, failed, timeout, refused; each try counts)",
            labels=["judge", "outcome"],
        )
        unparsed = CounterMetricFamily(
            "rollserve_judge_unparsed",
            "judge samples whose replies held no valid score (scored as the scale's lowest)",
            labels=["judge"],
        )
        flight = GaugeMetricFamily("rollserve_judge_in_flight", "judge calls in flight", labels=["judge"])
        healthy = GaugeMetricFamily("rollserve_judge_healthy", "1 if the judge's last call answered", labels=["judge"])
        latency = HistogramMetricFamily(
            "rollserve_judge_latency_seconds", "seconds per judge call (queue and tries)", labels=["judge"]
        )
        for judge in self._by_name.values():
            for outcome, count in judge.calls.items():
                calls.add_metric([judge.name, outcome], count)
            unparsed.add_metric([judge.name], judge.unparsed)
            flight.add_metric([judge.name], judge.in_flight)
            healthy.add_metric([judge.name], 1.0 if judge.healthy is not False else 0.0)
            buckets = [
                (str(b) if b != float("inf") else "+Inf", c) for b, c in zip(BUCKETS, judge._latency, strict=True)
            ]
            latency.add_metric([judge.name], buckets, judge._latency_sum)
        yield from (calls, unparsed, flight, healthy, latency)

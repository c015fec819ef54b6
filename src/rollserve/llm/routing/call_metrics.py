"""Per-backend LLM call metrics: each request's latency, and the tokens it sampled.

One observation per request the router sent to a backend (a try: a retried call is
two), from sending it to its answer or error; a request aborted by a pause or
abandoned by its caller is not counted. The backends answer whole replies (none
streams), so there is no time to first token to report.

prometheus-client's ``Histogram`` and ``Counter``, outside any global registry:
``/metrics`` yields them with the rest (``api/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import Literal

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from rollserve.llm.base import ChatReply, Generation

Outcome = Literal["ok", "error"]

# Seconds: a short reply from a warm server in milliseconds, a long one from a loaded
# server in minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class CallMetrics:
    """``rollserve_llm_request_seconds{backend,outcome}`` and
    ``rollserve_llm_output_tokens_total{backend}``."""

    def __init__(self) -> None:
        self.latency = Histogram(
            "rollserve_llm_request_seconds",
            "seconds from sending a request to a backend to its answer (ok) or error",
            ("backend", "outcome"),
            registry=None,
            buckets=CALL_BUCKETS,
        )
        self.output_tokens = Counter(
            "rollserve_llm_output_tokens",
            "tokens sampled by each backend (a message-level backend: as its usage reports)",
            ("backend",),
            registry=None,
        )

        self._live: set[str] = set()  # backends registered now: only they have series

    def track(self, backend: str) -> None:
        self._live.add(backend)

    def forget(self, backend: str) -> None:
        """A removed backend's series go (backends come and go at run time, under new
        names: kept, they would grow /metrics without end); a late answer to one of its
        requests is not observed."""
        self._live.discard(backend)
        for outcome in ("ok", "error"):
            with suppress(KeyError):
                self.latency.remove(backend, outcome)
        with suppress(KeyError):
            self.output_tokens.remove(backend)

    def failed(self, backend: str, seconds: float) -> None:
        if backend in self._live:
            self.latency.labels(backend, "error").observe(seconds)

    def answered(self, backend: str, seconds: float, reply: Generation | ChatReply) -> None:
        if backend not in self._live:
            return
        self.latency.labels(backend, "ok").observe(seconds)
        tokens = self.output_tokens.labels(backend)
        if isinstance(reply, Generation):
            tokens.inc(len(reply.output_ids))
        else:
            completion = reply.usage.get("completion_tokens")
            if isinstance(completion, int) and completion >= 0:
                tokens.inc(completion)

    def collect(self) -> Iterator[Metric]:
        yield from self.latency.collect()
        yield from self.output_tokens.collect()

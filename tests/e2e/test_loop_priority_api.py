"""`rollserve serve` runs the API's requests ahead of the rollouts' work
(``engine.priority.ApiFirstLoop``, ``--rollout-slice-ms``): through the HTTP API, a batch
runs to the end on that loop with exact tokens, ``/metrics`` has the gauge of the
rollouts' work waiting for its slices, and ``--rollout-slice-ms 0`` serves on asyncio's
own loop (no such gauge) with the same results. How much sooner a request is answered is
measured in ``benchmarks/concurrency.py`` (docs/benchmarks.md), never asserted here."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollserve.client import Client
from tests.e2e.conftest import check_completed_as_sampled

GAUGE = "rollserve_loop_background_waiting"
TASKS = [
    {"data_source": "math", "n": 8, "instance": {"question": f"What is {i} + 2?", "answer": str(i + 2)}}
    for i in range(4)
]


def _gauge(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == GAUGE]
    return values[0] if values else None


@pytest.mark.parametrize("slice_args", [[], ["--rollout-slice-ms", "0"]], ids=["api-first", "one-queue"])
def test_a_batch_runs_to_the_end_on_the_served_loop(server_factory, fake_llm_thread, slice_args):
    fake = fake_llm_thread(replies=["Let me think.", "So it is \\boxed{4}."], latency=0.05)
    server = server_factory("--backend", fake.url, *slice_args).start()
    with Client(server.url) as client:
        client.submit(TASKS, sampling={"max_tokens": 32}, agent={"max_turns": 2})
        waiting = _gauge(server.url)  # (its value is whatever waits then; its presence names the loop)
        results = list(client.stream_results(after=0, until=32, wait=30))
    if slice_args:
        assert waiting is None
    else:
        assert waiting is not None and waiting >= 0
    assert len({r.id for r in results}) == 32
    check_completed_as_sampled(results, fake)

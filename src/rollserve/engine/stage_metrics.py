"""Per-stage latency histograms: how long rollouts wait for a stage's slot, and how
long the stage then runs, by stage and data_source.

prometheus-client's ``Histogram``s, held by the engine and kept out of any global
registry: ``/metrics`` (``api/metrics.py``) yields them with the rest of its
families, so each service (and each test's) has its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric

from rollserve.contract import Stage

# Seconds: a stage runs from milliseconds (a math answer scored) to the better part of
# an hour (an SWE episode); a wait for a slot as long.
STAGE_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


class StageLatency:
    """``rollserve_stage_queue_wait_seconds`` and ``rollserve_stage_duration_seconds``,
    labelled ``stage`` and ``data_source`` (handler names: a bounded set)."""

    def __init__(self) -> None:
        labels = ("stage", "data_source")
        self.queue_wait = Histogram(
            "rollserve_stage_queue_wait_seconds",
            "seconds a rollout waited for a free slot of the stage (counted when it got one)",
            labels,
            registry=None,
            buckets=STAGE_BUCKETS,
        )
        self.duration = Histogram(
            "rollserve_stage_duration_seconds",
            "seconds a stage ran, holding its slot, whatever its outcome (counted when it ended)",
            labels,
            registry=None,
            buckets=STAGE_BUCKETS,
        )

    def waited(self, stage: Stage, data_source: str, seconds: float) -> None:
        self.queue_wait.labels(stage, data_source).observe(seconds)

    def ran(self, stage: Stage, data_source: str, seconds: float) -> None:
        self.duration.labels(stage, data_source).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        yield from self.queue_wait.collect()
        yield from self.duration.collect()

"""Prometheus metrics: counters and gauges read from the engine and router when scraped;
the latency histograms the engine (per stage) and the router (per backend) keep."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rollserve.api.base import ApiService
from rollserve.contract import BackendState, EngineStatus, NodeStatus, RouterStatus
from rollserve.engine.priority import ApiFirstLoop

router = APIRouter(tags=["service"])


class ServiceCollector:
    def __init__(self, service: ApiService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        status = self.service.rollouts.status()
        finished = CounterMetricFamily(
            "rollserve_rollouts_finished", "rollouts finished since start", labels=["status"]
        )
        for name, count in status.finished.items():
            finished.add_metric([name], count)
        yield finished
        yield GaugeMetricFamily(
            "rollserve_rollouts_in_flight", "rollouts admitted, not finished", value=status.in_flight
        )
        yield from _stage_metrics(status)
        if status.nodes is not None:  # rollserve serve --ray
            yield from _node_metrics(status.nodes)
        yield from self._llm()
        trajectories = CounterMetricFamily("rollserve_trajectories", "over finished rollouts", labels=["what"])
        for what, count in status.trajectories.model_dump().items():
            trajectories.add_metric([what], count)
        yield trajectories
        yield from _group_metrics(status)
        masked = CounterMetricFamily(
            "rollserve_rollouts_masked",
            "finished rollouts masked (not to train on), by why: "
            "an infra or timeout failure, or stale turns; and the stage it ended in",
            labels=["kind", "stage"],
        )
        for (kind, where), count in sorted(self.service.engine.masked.items()):
            masked.add_metric([kind, where], count)
        yield masked
        yield from self._sandboxes()
        yield from _loop_metrics()
        # Histograms the engine and the router observe as they go (the only bookkeeping).
        yield from self.service.engine.latency.collect()
        yield from self.service.router.metrics.collect()
        yield from self.service.judges.collect()

    def _llm(self) -> Iterator[Metric]:
        """The router's backends (outstanding, healthy), pause, policy version and calls."""
        outstanding = GaugeMetricFamily("rollserve_llm_outstanding", "LLM requests in flight", labels=["backend"])
        healthy = GaugeMetricFamily("rollserve_llm_healthy", "1 if the backend takes new requests", labels=["backend"])
        for backend in (BackendState.model_validate(b) for b in self.service.router.list()):
            outstanding.add_metric([backend.name], backend.outstanding)
            healthy.add_metric([backend.name], float(backend.healthy and not backend.draining))
        yield outstanding
        yield healthy
        llm = RouterStatus.model_validate(self.service.router.status())
        yield GaugeMetricFamily("rollserve_llm_paused", "1 while generation is paused", value=float(llm.paused))
        if llm.policy_version is not None:
            yield GaugeMetricFamily(
                "rollserve_llm_policy_version", "policy version of new turns", value=llm.policy_version
            )
        calls = CounterMetricFamily("rollserve_llm_calls", "router calls by outcome", labels=["kind"])
        for kind, count in (
            ("calls", llm.calls),
            ("retries", llm.retries),
            ("aborted_by_pause", llm.aborted_by_pause),
            ("failed", llm.failed),
            ("moves", llm.moves),
        ):
            calls.add_metric([kind], count)
        yield calls

    def _sandboxes(self) -> Iterator[Metric]:
        sandboxes = self.service.sandbox_status()
        yield GaugeMetricFamily("rollserve_sandboxes_open", "sandboxes open now", value=sandboxes.open)
        yield CounterMetricFamily(
            "rollserve_sandboxes_started", "sandboxes started since start", value=sandboxes.started
        )
        reaped = sandboxes.reaped_at_start
        yield GaugeMetricFamily(
            "rollserve_sandboxes_reaped_at_start",
            "sandboxes a previous server left, removed when this one started",
            value=reaped.sandboxes if reaped is not None else 0,
        )


def _stage_metrics(status: EngineStatus) -> Iterator[Metric]:
    """Each stage pool's workers, busy and queued slots, and slot-seconds used."""
    gauges = {
        key: GaugeMetricFamily(f"rollserve_stage_{key}", f"{key} per stage", labels=["stage"])
        for key in ("workers", "busy", "queued")
    }
    busy_seconds = CounterMetricFamily("rollserve_stage_busy_seconds", "slot-seconds used per stage", labels=["stage"])
    for stage, snap in status.stages.items():
        gauges["workers"].add_metric([stage], snap.workers)
        gauges["busy"].add_metric([stage], snap.busy)
        gauges["queued"].add_metric([stage], snap.queued)
        busy_seconds.add_metric([stage], snap.busy_seconds)
    yield from gauges.values()
    yield busy_seconds


def _group_metrics(status: EngineStatus) -> Iterator[Metric]:
    """Rollouts of groups (started, usable, used, cancelled) and settled groups by verdict."""
    g = status.groups
    samples = CounterMetricFamily(
        "rollserve_group_samples",
        "rollouts of groups: started, usable, used (the first n "
        "of each settled group), cancelled (extras stopped by over-sampling's early stop)",
        labels=["what"],
    )
    for what, count in (
        ("started", g.samples_started),
        ("usable", g.samples_usable),
        ("used", g.samples_used),
        ("cancelled", g.samples_cancelled),
    ):
        samples.add_metric([what], count)
    yield samples
    groups = CounterMetricFamily(
        "rollserve_groups", "settled groups: all, usable, too few usable, filtered (zero variance)", labels=["what"]
    )
    for what, count in (
        ("settled", g.groups_settled),
        ("usable", g.groups_usable),
        ("too_few_usable", g.groups_too_few_usable),
        ("filtered", g.groups_filtered),
    ):
        groups.add_metric([what], count)
    yield groups


def _node_metrics(nodes: list[NodeStatus]) -> Iterator[Metric]:
    """Per Ray node: alive, draining, slots, hosted, sandboxes open; busy per stage."""
    per_node = {
        key: GaugeMetricFamily(f"rollserve_node_{key}", what, labels=["node"])
        for key, what in (
            ("alive", "1 while the node's worker answers"),
            ("draining", "1 while the node takes no new rollouts"),
            ("slots", "rollouts the node may host at once"),
            ("hosted", "rollouts placed on the node, not cleaned up"),
            ("sandboxes_open", "sandboxes its worker holds open"),
        )
    }
    busy = GaugeMetricFamily("rollserve_node_busy", "stage calls running on the node", labels=["node", "stage"])
    placed = CounterMetricFamily("rollserve_node_placed", "rollouts placed on the node", labels=["node"])
    lost = CounterMetricFamily("rollserve_node_lost", "attempts ended by the node's death", labels=["node"])
    newest: dict[str, NodeStatus] = {}
    for node in nodes:  # one series per node name: its live worker, else its last one
        if node.alive or not newest.get(node.name, node).alive:
            newest[node.name] = node
    for node in newest.values():
        per_node["alive"].add_metric([node.name], float(node.alive))
        per_node["draining"].add_metric([node.name], float(node.draining))
        per_node["slots"].add_metric([node.name], node.slots)
        per_node["hosted"].add_metric([node.name], node.hosted)
        per_node["sandboxes_open"].add_metric([node.name], node.sandboxes_open)
        for stage, count in node.busy.items():
            busy.add_metric([node.name, stage], count)
        placed.add_metric([node.name], node.placed)
        lost.add_metric([node.name], node.lost)
    yield from per_node.values()
    yield from (busy, placed, lost)


def _loop_metrics() -> Iterator[Metric]:
    """The rollouts' work waiting on the event loop, where the loop keeps it apart
    (``rollserve serve``'s ``ApiFirstLoop``; nothing on another loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # scraped off the loop
        return
    if isinstance(loop, ApiFirstLoop):
        yield GaugeMetricFamily(
            "rollserve_loop_background_waiting",
            "callbacks of rollouts waiting for their slice of the event loop "
            "(high for long: the server's loop is at its CPU's limit)",
            value=loop.background_waiting,
        )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
)
async def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def metrics_registry(service: ApiService) -> CollectorRegistry:
    """The registry ``/metrics`` reads (``create_app`` makes one per app)."""
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))
    return registry

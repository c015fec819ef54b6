"""docs/grafana/rollserve.json, the Grafana dashboard we ship: every metric its panels
query is one a live server exports (so it never charts a name we renamed or never had),
and every panel reads the datasource the user picks in its template variable."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rollserve.testing import FakeVLLM

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "rollserve.json"
METRIC = re.compile(r"\brollserve_[a-z0-9_]+\b")
MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])  # a collapsed row holds its panels
    return panels


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def test_the_dashboard_reads_the_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    reference = "${" + variable["name"] + "}"
    charts = [p for p in _panels(dashboard) if p["type"] != "row"]
    assert len(charts) >= 12
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in charts:
        assert panel["datasource"]["uid"] == reference, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == reference and METRIC.search(target["expr"])
    for expr in _queries(dashboard):  # quantiles read a histogram's buckets
        if "histogram_quantile" in expr:
            assert all(name.endswith("_bucket") for name in METRIC.findall(expr)), expr


async def test_every_metric_the_dashboard_queries_is_exported(make_api):
    """After a batch with one answered and one failed request (so the error outcome and
    the masked counter have samples) and a policy version set, /metrics has a sample
    of every name the dashboard queries."""
    async with FakeVLLM("smollm2", replies=["\\boxed{4}"], latency=0.01) as server:
        _, client = await make_api(server={"llm": {"max_attempts": 1}})
        r = await client.post("/v1/llm/backends", json={"url": server.url, "name": "fake"})
        assert r.status_code == 201, r.text
        assert (await client.post("/v1/llm/pause", json={"mode": "finish"})).status_code == 200
        assert (await client.post("/v1/llm/resume", json={"policy_version": 1})).status_code == 200
        r = await client.post("/v1/rollouts:run", json={"task": MATH, "wait": 60})
        assert r.json()["rollouts"][0]["result"]["status"] == "completed", r.text
        server.fail_next(1)
        r = await client.post("/v1/rollouts:run", json={"task": MATH, "wait": 60})
        assert r.json()["rollouts"][0]["result"]["mask"] is True, r.text
        text = (await client.get("/metrics")).text
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    queried = {name for expr in _queries(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(expr)}
    assert len(queried) >= 15
    assert queried <= exported, f"not exported: {sorted(queried - exported)}"

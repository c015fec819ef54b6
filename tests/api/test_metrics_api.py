"""``/metrics``' latency histograms, through the API: a batch over two fake vLLM backends,
then the exposition parsed with prometheus-client's own parser. Every count is checked
against what happened (stages run, requests each server answered, tokens sampled);
no timing is asserted."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from rollserve.testing import FakeVLLM

RETRY_HINT = "I could not find a final answer"


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class CountingPolicy:
    """Math: an answer without a box first, the boxed answer after the retry message
    (two requests per rollout); stem: the letter at once (one request)."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, prompt_ids: list[int], prompt: str) -> str:
        self.requests += 1
        if "Which number is larger" in prompt:
            return "Answer: B"
        return "\\boxed{4}" if RETRY_HINT in prompt else "Let me add them up."


MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "n": 3}
STEM = {
    "data_source": "stem",
    "n": 2,
    "instance": {"question": "Which number is larger?", "choices": ["3", "9"], "answer": "B"},
}


async def test_stage_and_backend_histograms_count_what_ran(make_api):
    left, right = CountingPolicy(), CountingPolicy()
    async with (
        FakeVLLM("smollm2", replies=left, latency=0.01) as a,
        FakeVLLM("smollm2", replies=right, latency=0.01) as b,
    ):
        _, client = await make_api()
        for name, server in (("left", a), ("right", b)):
            r = await client.post("/v1/llm/backends", json={"url": server.url, "name": name})
            assert r.status_code == 201, r.text
        r = await client.post(
            "/v1/rollouts", json={"tasks": [MATH, STEM], "sampling": {"max_tokens": 32}, "agent": {"max_turns": 3}}
        )
        assert r.status_code == 202, r.text
        results = []
        for group in r.json()["groups"]:
            view = (await client.get(f"/v1/groups/{group['group_id']}", params={"wait": 60})).json()
            assert view["done"], view
            results += [item["result"] for item in view["rollouts"]]
        text = (await client.get("/metrics")).text

    assert [r["status"] for r in results] == ["completed"] * 5
    assert all(r["reward"] == 1.0 for r in results)
    samples = _samples(text)
    for stage in ("init", "run", "eval"):
        for source, n in (("math", 3), ("stem", 2)):
            for name in ("rollserve_stage_queue_wait_seconds", "rollserve_stage_duration_seconds"):
                assert _value(samples, f"{name}_count", stage=stage, data_source=source) == n
                assert _value(samples, f"{name}_bucket", stage=stage, data_source=source, le="+Inf") == n
                total = _value(samples, f"{name}_sum", stage=stage, data_source=source)
                assert total is not None and total >= 0.0

    # Per backend: one observation per request its server answered, all of them ok.
    turns = [t for r in results for t in r["trajectory"]["turns"]]
    assert len(turns) == 3 * 2 + 2 * 1 == left.requests + right.requests
    by_backend = Counter(t["backend"] for t in turns)
    tokens_by_backend = Counter()
    for t in turns:
        tokens_by_backend[t["backend"]] += len(t["output_ids"])
    for name, policy in (("left", left), ("right", right)):
        ok = _value(samples, "rollserve_llm_request_seconds_count", backend=name, outcome="ok")
        assert (ok or 0.0) == policy.requests == by_backend[name]
        assert _value(samples, "rollserve_llm_request_seconds_count", backend=name, outcome="error") is None
        tokens = _value(samples, "rollserve_llm_output_tokens_total", backend=name)
        assert (tokens or 0.0) == tokens_by_backend[name]
    assert sum(tokens_by_backend.values()) == sum(r["stats"]["output_tokens"] for r in results)
    # What /metrics had before is still there.
    assert _value(samples, "rollserve_rollouts_finished_total", status="completed") == 5
    assert _value(samples, "rollserve_llm_calls_total", kind="calls") == 8
    assert _value(samples, "rollserve_sandboxes_open") == 0  # math and stem need none
    assert not [key for key in samples if key[0] == "rollserve_rollouts_masked_total"]


async def test_a_failed_request_is_observed_as_an_error(make_api):
    """A backend that answers 500: each try is one ``outcome="error"`` observation."""
    async with FakeVLLM("smollm2", replies=["\\boxed{4}"]) as server:
        service, client = await make_api(server={"llm": {"max_attempts": 2, "retry_backoff": 0.01}})
        r = await client.post("/v1/llm/backends", json={"url": server.url, "name": "flaky"})
        assert r.status_code == 201, r.text
        server.fail_next(2)
        r = await client.post("/v1/rollouts:run", json={"task": {**MATH, "n": 1}, "wait": 60})
        assert r.status_code == 200, r.text
        (result,) = [item["result"] for item in r.json()["rollouts"]]
        text = (await client.get("/metrics")).text
    samples = _samples(text)
    assert result["status"] == "failed" and result["failure"]["kind"] == "infra"
    assert _value(samples, "rollserve_llm_request_seconds_count", backend="flaky", outcome="error") == 2
    assert _value(samples, "rollserve_llm_request_seconds_count", backend="flaky", outcome="ok") is None
    assert _value(samples, "rollserve_rollouts_masked_total", kind="infra", stage="run") == 1
    assert [key for key in samples if key[0] == "rollserve_rollouts_masked_total"] == [
        ("rollserve_rollouts_masked_total", frozenset({("kind", "infra"), ("stage", "run")}))
    ]


async def test_a_backend_s_credentials_stay_out_of_its_series_and_removed_ones_go(make_api):
    """A backend URL with ``user:password@`` gets a default name (a metric label, shown on
    the dashboard) without them; a removed backend's series leave /metrics (backends
    come and go under new names: kept, the series would grow without end)."""
    async with FakeVLLM("smollm2", replies=["\\boxed{4}"]) as llm:
        _, client = await make_api()
        url = llm.url.replace("http://", "http://trainer:s3cret-pw@")
        r = await client.post("/v1/llm/backends", json={"url": url})
        assert r.status_code == 201, r.text
        name = r.json()["backend"]["name"]
        assert name == "vllm@" + llm.url.removeprefix("http://").rstrip("/"), name
        r = await client.post(
            "/v1/rollouts:run",
            json={
                "task": {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}},
                "sampling": {"max_tokens": 8},
                "agent": {"max_turns": 1},
            },
        )
        assert r.status_code == 200, r.text
        text = (await client.get("/metrics")).text
        assert "s3cret" not in text
        samples = _samples(text)
        assert _value(samples, "rollserve_llm_request_seconds_count", backend=name, outcome="ok") == 1
        assert (await client.delete(f"/v1/llm/backends/{name}")).status_code == 200
        text = (await client.get("/metrics")).text
        assert not [
            key for key in _samples(text) if ("backend", name) in key[1] and key[0].startswith("rollserve_llm_")
        ]

"""Input no part of rollserve can hold is a 4xx naming the field, never a 500: integers
past 64 bits, lone surrogates, deep nesting, NaN, bytes that are not UTF-8, values of
the wrong JSON type; and nothing of a refused request is admitted."""

from __future__ import annotations

import json

import httpx
import pytest

from rollserve.api.prorl import ProRLConfig

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
JSON = {"content-type": "application/json"}


@pytest.fixture
async def client(make_api):
    _, client = await make_api(prorl=ProRLConfig())
    # A 500 must come back as a response here, not as the app's exception.
    client._transport = httpx.ASGITransport(app=client._transport.app, raise_app_exceptions=False)
    return client


async def refused(client, method: str, url: str, field: str, status: int = 422, **kwargs) -> dict:
    r = await client.request(method, url, **kwargs)
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert any(e["field"] == field for e in body["errors"]), body
    assert field in body["detail"]
    return body


async def nothing_admitted(client) -> None:
    status = (await client.get("/v1/status")).json()
    assert status["in_flight"] == 0 and status["last_seq"] == 0


def raw(text: str) -> dict:
    """A body sent exactly as written (a client's JSON encoder would refuse some)."""
    return {"content": text.encode("utf-8", "surrogatepass"), "headers": JSON}


async def test_integers_past_64_bits_are_422_naming_the_field(client):
    await refused(client, "GET", "/v1/results", "after", params={"after": 2**63})
    await refused(client, "GET", "/v1/results", "after", params={"after": -1})
    assert (await client.get("/v1/results", params={"after": 2**63 - 1})).status_code == 200
    big = {**MATH, "instance": {**MATH["instance"], "count": 2**64}}
    await refused(client, "POST", "/v1/rollouts", "tasks[0].instance.count", json={"tasks": [big]})
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "tasks[0].metadata.n",
        json={"tasks": [{**MATH, "metadata": {"n": -(2**63) - 1}}]},
    )
    digits = '{"tasks": [{"data_source": "math", "instance": {"question": "q", "answer": ' + "9" * 5000 + "}}]}"
    await refused(client, "POST", "/v1/rollouts", "body", **raw(digits))
    await refused(client, "POST", "/v1/rollouts", "sampling.seed", json={"tasks": [MATH], "sampling": {"seed": 2**70}})
    await refused(client, "POST", "/v1/rollouts", "sampling.seed", json={"tasks": [MATH], "sampling": {"seed": -1}})
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "sampling.stop_token_ids[0]",
        json={"tasks": [MATH], "sampling": {"stop_token_ids": [2**40]}},
    )
    await refused(client, "POST", "/v1/llm/resume", "policy_version", json={"policy_version": 10**30})
    assert (await client.get("/metrics")).status_code == 200  # read policy_version: still fine
    await nothing_admitted(client)


async def test_lone_surrogates_are_422_naming_the_field(client):
    lone = "\ud800"
    for body, field in [
        ({"tasks": [{**MATH, "instance": {"question": lone, "answer": "4"}}]}, "tasks[0].instance.question"),
        ({"tasks": [{**MATH, "metadata": {"note": "ok " + lone}}]}, "tasks[0].metadata.note"),
        ({"tasks": [{**MATH, "metadata": {lone: 1}}]}, "tasks[0].metadata.\\ud800"),
        ({"tasks": [{**MATH, "data_source": lone}]}, "tasks[0].data_source"),
    ]:
        text = json.dumps(body)  # escaped: "\ud800" as the six characters JSON allows
        found = await refused(client, "POST", "/v1/rollouts", field, **raw(text))
        assert "surrogate" in found["detail"]
    # Raw (surrogates encoded as if UTF-8, which json.loads would let through): not UTF-8.
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "body",
        **raw(json.dumps({"tasks": [{**MATH, "instance": {"question": lone, "answer": "4"}}]}, ensure_ascii=False)),
    )
    await client.post("/start")
    await refused(
        client,
        "POST",
        "/process",
        "instance.question",
        **raw(json.dumps({"instance": {**MATH["instance"], "question": lone}, "sampling_params": {}})),
    )
    await nothing_admitted(client)
    assert (await client.get("/v1/results")).status_code == 200


async def test_deep_nesting_is_a_422_naming_where(client):
    def nested(depth: int) -> object:
        return json.loads("[" * depth + "]" * depth)

    for depth in (300, 5000):
        text = json.dumps({"tasks": [{**MATH, "instance": {**MATH["instance"], "x": 0}}]})
        text = text.replace('"x": 0', '"x": ' + "[" * depth + "]" * depth)
        found = await refused(
            client,
            "POST",
            "/v1/rollouts",
            "tasks[0].instance.x[0][0][0][0][0][0][0][0][0]..." if depth == 300 else "body",
            **raw(text),
        )
        assert "nested deeper than 64 levels" in found["detail"]
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "tasks[0].metadata.m[0][0][0][0][0][0][0][0][0]...",
        json={"tasks": [{**MATH, "metadata": {"m": nested(256)}}]},
    )
    await nothing_admitted(client)
    # Nesting well inside the bound is fine.
    ok = {**MATH, "instance": {**MATH["instance"], "x": nested(40)}}
    assert (await client.post("/v1/rollouts", json={"tasks": [ok]})).status_code == 202


async def test_non_json_numbers_and_bytes_are_422(client):
    for text in (
        '{"tasks": [{"data_source": "math", "instance": {"question": "q", "answer": NaN}}]}',
        '{"tasks": [{"data_source": "math", "instance": {"question": "q"}, "metadata": {"a": -Infinity}}]}',
    ):
        await refused(client, "POST", "/v1/rollouts", "body", **raw(text))
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "tasks[0].metadata.a",
        **raw(
            '{"tasks": [{"data_source": "math", "instance": {"question": "q", '
            '"answer": "1"}, "metadata": {"a": 1e999}}]}'
        ),
    )
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "body",
        content=b'{"tasks": [{"data_source": "math", "instance": {"question": "\xff"}}]}',
        headers=JSON,
    )
    await refused(client, "POST", "/v1/rollouts", "body", **raw('{"tasks": [}'))
    await nothing_admitted(client)


async def test_values_must_have_the_published_json_type(client):
    await refused(client, "POST", "/v1/rollouts", "tasks[0].n", json={"tasks": [{**MATH, "n": "2"}]})
    await refused(client, "POST", "/v1/llm/pause", "forward", json={"forward": 0})
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "sampling.temperature",
        json={"tasks": [MATH], "sampling": {"temperature": "0.5"}},
    )
    await nothing_admitted(client)
    r = await client.post("/v1/rollouts", json={"tasks": [MATH], "sampling": {"temperature": 1}})
    assert r.status_code == 202  # an integer is a JSON number


async def test_a_batch_that_can_never_fit_is_422_with_the_limit(make_api):
    _, client = await make_api(max_pending=4)
    body = await refused(client, "POST", "/v1/rollouts", "tasks", json={"tasks": [{**MATH, "n": 3}, {**MATH, "n": 2}]})
    assert "5 rollout slots" in body["detail"] and "at most 4" in body["detail"]
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 4}]})
    assert r.status_code == 202  # the limit itself fits
    r = await client.post("/v1/rollouts", json={"tasks": [MATH]})
    assert r.status_code == 429 and "retry-after" in r.headers  # would fit later: a 429


async def test_size_limits_of_an_instance_and_a_request(make_api):
    limits = {"max_request_bytes": 200_000, "max_instance_bytes": 50_000}
    _, client = await make_api(server={"limits": limits})
    big = {**MATH, "instance": {"question": "x" * 60_000, "answer": "4"}}
    body = await refused(client, "POST", "/v1/rollouts", "tasks[1].instance", json={"tasks": [MATH, big]})
    assert "at most 50000" in body["detail"]
    await refused(
        client,
        "POST",
        "/v1/rollouts",
        "tasks[0].metadata",
        json={"tasks": [{**MATH, "metadata": {"blob": "y" * 60_000}}]},
    )
    huge = {"tasks": [MATH], "pad": "z" * 300_000}
    body = await refused(client, "POST", "/v1/rollouts", "body", status=413, json=huge)
    assert "200000 bytes" in body["detail"]

    async def chunks():  # no Content-Length: counted as it streams
        yield b'{"tasks": [], "pad": "'
        for _ in range(30):
            yield b"z" * 10_000
        yield b'"}'

    await refused(client, "POST", "/v1/rollouts", "body", status=413, content=chunks(), headers=JSON)
    await nothing_admitted(client)
    assert (await client.post("/v1/rollouts", json={"tasks": [MATH]})).status_code == 202

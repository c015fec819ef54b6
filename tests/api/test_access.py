"""Who may do what: the bearer token (any header bytes are a 401, never an error), the
schema and docs behind it unless opened, and no server-side path over HTTP (an
in-process backend is started from the command line only)."""

from __future__ import annotations

import logging

import httpx
import pytest

from rollserve.api.prorl import ProRLConfig

TOKEN = "s3cret-tök"  # a token may be any text; clients send it as UTF-8
AUTH = [(b"authorization", b"Bearer " + TOKEN.encode("utf-8"))]


@pytest.fixture
async def guarded(make_api):
    async def make(**server):
        _, client = await make_api(token=TOKEN, prorl=ProRLConfig(), server=server)
        client._transport = httpx.ASGITransport(app=client._transport.app, raise_app_exceptions=False)
        return client

    return make


async def test_any_bearer_header_is_a_401_not_an_error(guarded, caplog):
    client = await guarded()
    caplog.set_level(logging.DEBUG)
    for value in [
        "Bearer tök".encode(),
        "Bearer ü".encode("latin-1"),
        b"Bearer \xff\xfe",
        b"Bearer",
        b"Basic czNjcmV0",
        b"bearer  wrong ",
        b"",
    ]:
        r = await client.get("/v1/status", headers=[(b"authorization", value)])
        assert r.status_code == 401, (value, r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer" and "bearer token" in r.json()["detail"]
    assert (await client.get("/v1/status")).status_code == 401
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.ERROR]
    assert (await client.get("/v1/status", headers=AUTH)).status_code == 200
    assert (await client.get("/healthz")).status_code == 200


async def test_the_token_is_checked_before_the_body_is_read(guarded):
    client = await guarded()
    pulled = 0

    async def big_body():
        nonlocal pulled
        for _ in range(512):  # 32 MiB, if the server read it all
            pulled += 1
            yield b"x" * 65_536

    r = await client.post("/v1/rollouts", content=big_body(), headers=[(b"content-type", b"application/json")])
    assert r.status_code == 401
    assert pulled <= 2, f"the server read {pulled} chunks of a request it refuses"


async def test_schema_and_docs_are_behind_the_token_unless_opened(guarded):
    client = await guarded()
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert (await client.get(path)).status_code == 401, path
        assert (await client.get(path, headers=AUTH)).status_code == 200, path
    schema = (await client.get("/openapi.json", headers=AUTH)).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schema["paths"]["/v1/status"]["get"]["security"] == [{"bearer": []}]
    assert "401" in schema["paths"]["/v1/status"]["get"]["responses"]
    assert "security" not in schema["paths"]["/healthz"]["get"]

    opened = await guarded(public_docs=True)
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert (await opened.get(path)).status_code == 200, path
    assert (await opened.get("/v1/status")).status_code == 401  # only the docs are open


async def test_no_embedded_backend_from_a_path_over_http(guarded):
    client = await guarded()
    for spec, field in [
        ({"kind": "embedded", "model_path": "/etc/passwd", "name": "e"}, "kind"),
        ({"kind": "embedded"}, "kind"),
        ({"url": "http://127.0.0.1:9", "model_path": "/etc/passwd"}, "model_path"),
        ({"url": "file:///etc/passwd"}, "url"),
    ]:
        r = await client.post("/v1/llm/backends", json=spec, headers=AUTH)
        assert r.status_code == 422, (spec, r.text)
        assert any(e["field"] == field for e in r.json()["errors"]), r.json()
    assert (
        "command line"
        in (await client.post("/v1/llm/backends", json={"kind": "embedded"}, headers=AUTH)).json()["detail"]
    )
    for address in ("embedded=/etc/passwd", "embedded"):
        r = await client.post("/add_llm_server", json={"address": address}, headers=AUTH)
        assert r.status_code == 400, (address, r.text)
    listed = (await client.get("/v1/llm/backends", headers=AUTH)).json()["backends"]
    assert listed == []
    # Servers by URL still register.
    r = await client.post(
        "/v1/llm/backends", json={"kind": "sglang", "url": "http://127.0.0.1:9", "name": "s"}, headers=AUTH
    )
    assert r.status_code == 201 and r.json()["backend"]["name"] == "s"

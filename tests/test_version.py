"""The version is stated once (``rollserve.__version__``) and read everywhere else: the
wheel's metadata (pyproject.toml's dynamic version), GET /healthz, the OpenAPI
document, the clients' User-Agent; CHANGELOG.md's newest release is that version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import httpx

import rollserve
from rollserve.client import AsyncClient, Client

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_reads_the_version_from_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rollserve.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", rollserve.__version__), rollserve.__version__


def test_the_changelogs_newest_release_is_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.MULTILINE)
    assert headings[0] == "Unreleased", headings
    assert headings[1] == rollserve.__version__, headings
    # Every release says its date (Keep a Changelog: "## [1.2.3] - YYYY-MM-DD"), newest first.
    dated = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, flags=re.MULTILINE)
    assert [version for version, _ in dated] == headings[1:], dated
    assert [date for _, date in dated] == sorted((date for _, date in dated), reverse=True), dated


async def test_healthz_and_the_openapi_document_say_the_version(make_api) -> None:
    _, client = await make_api()
    assert (await client.get("/healthz")).json()["version"] == rollserve.__version__
    assert (await client.get("/openapi.json")).json()["info"]["version"] == rollserve.__version__


def _seen(requests: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"ok": True, "version": "whatever the server is"})

    return httpx.MockTransport(answer)


def test_the_sync_client_names_its_version_and_keeps_the_token() -> None:
    requests: list[httpx.Request] = []
    with Client("http://rollserve", token="s3cret", transport=_seen(requests)) as client:
        client.health()
    (request,) = requests
    assert request.headers["user-agent"] == f"rollserve/{rollserve.__version__}"
    assert request.headers["authorization"] == "Bearer s3cret"


async def test_the_async_client_names_its_version_without_a_token(monkeypatch) -> None:
    monkeypatch.delenv("ROLLSERVE_API_TOKEN", raising=False)
    requests: list[httpx.Request] = []
    async with AsyncClient("http://rollserve", transport=_seen(requests)) as client:
        await client.health()
    (request,) = requests
    assert request.headers["user-agent"] == f"rollserve/{rollserve.__version__}"
    assert "authorization" not in request.headers

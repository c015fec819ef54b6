"""``POST /v1/llm/resume`` never lowers the policy version in force by accident: a lower
``policy_version`` is a 409 naming it (generation stays paused, the version unchanged)
unless the request says ``allow_lower_version`` (a trainer restarting from an older
checkpoint); the clients' ``resume`` and ``WeightSync.update`` carry the override."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.client import AsyncClient
from rollserve.client.calls import RollserveError
from rollserve.client.weights import AsyncWeightSync, LoRA, LowerPolicyVersion
from rollserve.testing import FakeVLLM


async def _router(client: httpx.AsyncClient) -> dict:
    return (await client.get("/v1/llm/status")).json()


async def test_a_lower_version_is_refused_unless_the_resume_says_so(make_api):
    _, client = await make_api()
    assert (await client.post("/v1/llm/resume", json={"policy_version": 5})).status_code == 200
    assert (await client.post("/v1/llm/pause", json={"mode": "finish"})).status_code == 200
    r = await client.post("/v1/llm/resume", json={"policy_version": 3})
    assert r.status_code == 409, r.text
    (error,) = r.json()["errors"]
    assert (
        error["field"] == "policy_version"
        and "below the version in force (5)" in error["message"]
        and "allow_lower_version" in error["message"]
    )
    router = await _router(client)
    assert router["paused"] and router["policy_version"] == 5  # nothing changed
    # The same version, a higher one, or none at all: as before.
    for body, version in (({"policy_version": 5}, 5), ({}, 5), ({"policy_version": 6}, 6)):
        r = await client.post("/v1/llm/resume", json=body)
        assert r.status_code == 200 and r.json()["policy_version"] == version, r.text
    r = await client.post("/v1/llm/resume", json={"policy_version": 2, "allow_lower_version": True})
    assert r.status_code == 200 and r.json()["policy_version"] == 2, r.text
    router = await _router(client)
    assert not router["paused"] and router["policy_version"] == 2
    r = await client.post("/v1/llm/resume", json={"allow_lower_version": "sure"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "allow_lower_version"


def _adapter(tmp_path: Path) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return str(folder)


async def test_the_clients_carry_the_override_and_a_sync_refuses_before_loading(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake:
        service, _ = await make_api([fake.url])
        client = AsyncClient(
            "http://rollserve", transport=httpx.ASGITransport(app=create_app(service, manage_lifecycle=False))
        )
        try:
            await client.resume(policy_version=4)
            with pytest.raises(RollserveError) as refused:
                await client.resume(policy_version=1)
            assert refused.value.status == 409 and refused.value.fields == ("policy_version",)
            sync = AsyncWeightSync(client)
            with pytest.raises(LowerPolicyVersion) as lower:
                await sync.update(LoRA("policy", _adapter(tmp_path)), policy_version=3)
            assert not lower.value.paused and lower.value.policy_version == 4
            assert fake.weight_loads == []  # refused before anything was loaded
            status = (await client.list_backends()).router
            assert not status.paused and status.policy_version == 4
            report = await sync.update(
                LoRA("policy", str(tmp_path / "adapter")), policy_version=3, allow_lower_version=True
            )
            assert report.loaded.ok and report.resumed.policy_version == 3
            assert (await client.resume(policy_version=2, allow_lower_version=True)).policy_version == 2
        finally:
            await client.aclose()

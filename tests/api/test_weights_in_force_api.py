"""The weights in force (the adapter the policy is, its version, the last load that
took) outlive the server's process, and a server added at run time while an adapter is
in force must show that it serves it: otherwise rollouts would sample a model the
trainer is not training, stamped as its policy."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.api.prorl import ProRLConfig
from rollserve.client import AsyncClient
from rollserve.client.weights import AsyncWeightSync, LoRA
from rollserve.engine.weights_file import WeightsFileError
from rollserve.llm.routing.in_force import WeightsInForce
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM
from tests.api.test_weight_sync_api import adapter, rollserve_client


async def test_a_server_that_does_not_list_the_adapter_in_force_is_refused(make_api, tok, tmp_path):
    """Once the policy is an adapter, a vLLM server added at run time is asked for its
    ``/v1/models``: one that does not serve the adapter (started without
    ``--lora-modules``) is refused with a 409 naming it, over rollserve's API and
    ProRL's alike, and never samples; once it serves it, it is added."""
    path = adapter(tmp_path)
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as first, FakeVLLM(tok, runtime_lora=True) as bare:
        service, http = await make_api([first.url], prorl=ProRLConfig())
        client = rollserve_client(service)
        await AsyncWeightSync(client).update(LoRA("policy", path), policy_version=2)
        r = await http.post("/v1/llm/backends", json={"url": bare.url, "name": "bare"})
        assert r.status_code == 409, r.text
        assert "does not serve the LoRA adapter 'policy'" in r.json()["detail"]
        r = await http.post("/add_llm_server", json={"address": f"{bare.url}/v1"})
        assert r.status_code == 400 and "does not serve the LoRA adapter 'policy'" in r.text
        refused = [b["name"] for b in service.router.list()]
        async with httpx.AsyncClient() as direct:  # now it serves the adapter
            (
                await direct.post(f"{bare.url}/v1/load_lora_adapter", json={"lora_name": "policy", "lora_path": path})
            ).raise_for_status()
        r = await http.post("/v1/llm/backends", json={"url": bare.url, "name": "bare"})
        await client.aclose()
    assert refused == [service.router.list()[0]["name"]]
    assert r.status_code == 201, r.text
    assert not [c for c in bare.calls if c.request.get("model") != "policy"]


async def test_the_weights_in_force_are_kept_for_a_restart_and_a_bad_record_stops_it(tok, tmp_path):
    """A resume's version and a load's adapter are written beside the store; a server
    made on the same state dir starts from them; a record that does not parse stops the
    server at start, naming the file (it would otherwise guess the base model)."""
    path = adapter(tmp_path)
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake:
        config = ServerConfig(state_dir=tmp_path / "state", backends=[fake.url])
        for step in range(2):
            service = Service(config)
            await service.start()
            client = rollserve_client(service)
            if step == 0:
                await client.resume(policy_version=3)
                kept = WeightsInForce.model_validate_json(service.weights_path.read_text())
                await AsyncWeightSync(client).update(LoRA("policy", path), policy_version=4)
            else:
                status = (await client.status()).llm
            await client.aclose()
            await service.stop()
    assert kept.policy_version == 3 and kept.lora is None and kept.last_load is None
    assert status.policy_version == 4 and status.lora == "policy"
    assert status.last_load is not None and status.last_load.path == path
    assert service.weights_path == tmp_path / "state" / "rollserve.weights.json"
    service.weights_path.write_text('{"policy_version": "four"}')
    with pytest.raises(WeightsFileError, match="rollserve.weights.json"):
        Service(config)


async def test_a_restart_between_a_load_and_its_resume_starts_paused(tok, tmp_path):
    """The servers hold the new adapter, the version that names it never came: a
    restarted head must not sample it under the old version (it starts paused, and the
    trainer's resume names the version)."""
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake:
        config = ServerConfig(state_dir=tmp_path / "state", backends=[fake.url])
        service = Service(config)
        await service.start()
        client = rollserve_client(service)
        await client.resume(policy_version=3)
        await client.pause("finish", timeout=5)
        loaded = await client.load_weights({"kind": "lora", "name": "policy", "path": adapter(tmp_path)}, 4)
        assert loaded.ok
        await client.aclose()
        await service.stop()  # the head stops before the resume(4)
        service = Service(config)
        await service.start()
        client = rollserve_client(service)
        try:
            status = (await client.status()).llm
            assert (status.paused, status.policy_version, status.lora) == (True, 3, "policy")
            resumed = await client.resume(policy_version=4)
            assert resumed.policy_version == 4
            assert not (await client.status()).llm.paused
        finally:
            await client.aclose()
            await service.stop()
        # ...and once resumed, a restart starts unpaused at 4.
        service = Service(config)
        await service.start()
        try:
            assert (service.router.paused, service.router.policy_version) == (False, 4)
        finally:
            await service.stop()


async def test_two_adds_of_one_name_at_once_are_one_201_and_one_409(tok, tmp_path):
    folder = adapter(tmp_path)
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as first, FakeVLLM(tok, runtime_lora=True) as second:
        service = Service(ServerConfig(state_dir=tmp_path / "state", backends=[first.url]))
        await service.start()
        app = create_app(service, manage_lifecycle=False)
        client = AsyncClient("http://rs", transport=httpx.ASGITransport(app=app))
        try:
            await AsyncWeightSync(client).update(LoRA("policy", folder), policy_version=2)
            async with httpx.AsyncClient() as direct:  # the second serves it too
                (
                    await direct.post(
                        f"{second.url}/v1/load_lora_adapter", json={"lora_name": "policy", "lora_path": folder}
                    )
                ).raise_for_status()
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://rs"
            ) as http:
                replies = await asyncio.gather(
                    *(http.post("/v1/llm/backends", json={"url": second.url, "name": "b"}) for _ in range(2))
                )
            assert sorted(r.status_code for r in replies) == [201, 409], [r.text for r in replies]
        finally:
            await client.aclose()
            await service.stop()

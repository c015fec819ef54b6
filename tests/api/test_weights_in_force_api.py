"""The weights in force (the adapter the policy is, its version, the last load that
took) outlive the server's process, and a server added at run time while an adapter is
in force must show that it serves it: otherwise rollouts would sample a model the
trainer is not training, stamped as its policy."""

from __future__ import annotations

import json
from pathlib import Path

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


def adapter(tmp_path: Path, name: str = "adapter") -> str:
    """A folder that looks like a PEFT adapter to the double (it reads adapter_config.json)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return str(folder)


def rollserve_client(service: Service) -> AsyncClient:
    app = create_app(service, manage_lifecycle=False)
    return AsyncClient("http://rollserve", transport=httpx.ASGITransport(app=app))


async def test_a_server_that_does_not_list_the_adapter_in_force_is_refused(
        make_api, tok, tmp_path):
    """Once the policy is an adapter, a vLLM server added at run time is asked for its
    ``/v1/models``: one that does not serve the adapter (started without
    ``--lora-modules``) is refused with a 409 naming it, over rollserve's API and
    ProRL's alike, and never samples; once it serves it, it is added."""
    path = adapter(tmp_path)
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as first, \
            FakeVLLM(tok, runtime_lora=True) as bare:
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
            (await direct.post(f"{bare.url}/v1/load_lora_adapter",
                               json={"lora_name": "policy", "lora_path": path})
             ).raise_for_status()
        r = await http.post("/v1/llm/backends", json={"url": bare.url, "name": "bare"})
        await client.aclose()
    assert refused == [service.router.list()[0]["name"]]
    assert r.status_code == 201, r.text
    assert not [c for c in bare.calls if c.request.get("model") != "policy"]


async def test_the_weights_in_force_are_kept_for_a_restart_and_a_bad_record_stops_it(
        tok, tmp_path):
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

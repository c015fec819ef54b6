"""Weight sync through the HTTP API, as a trainer does it: ``WeightSync`` pauses
generation, loads a LoRA adapter or full weights into every inference server, and
resumes under the new policy version. The doubles load weights as vLLM and SGLang do
(``/v1/load_lora_adapter``, dev mode's ``/collective_rpc reload_weights``,
``/update_weights_from_disk``), and new weights change what they sample: each turn
must be stamped with the version whose weights sampled it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from rollserve.api.app import create_app
from rollserve.client import AsyncClient
from rollserve.client.weights import (
    AsyncWeightSync,
    FullWeights,
    LoRA,
    WeightLoadFailed,
    WeightsRefused,
)
from rollserve.testing import FakeVLLM
from rollserve.testing.fake_llamacpp import FakeLlamaCpp
from rollserve.testing.fake_server import fake_logprobs
from rollserve.testing.fake_sglang import FakeSGLang
from tests.waiting import eventually

TASK = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
SETTINGS = {"sampling": {"max_tokens": 32}, "agent": {"max_turns": 2}}


def adapter(tmp_path: Path, name: str = "adapter") -> str:
    """A folder that looks like a PEFT adapter to the double (it reads adapter_config.json)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return str(folder)


def rollserve_client(service) -> AsyncClient:
    app = create_app(service, manage_lifecycle=False)
    return AsyncClient("http://rollserve", transport=httpx.ASGITransport(app=app))


def policy_of(fake: FakeVLLM):
    """The base model answers wrong; once an adapter is loaded, it answers right."""
    return lambda ids, text: "\\boxed{4}" if fake.lora_adapters else "\\boxed{5}"


async def rollouts(client: AsyncClient, n: int) -> list[dict]:
    accepted = await client.submit([{**TASK, "n": n}], **SETTINGS)
    view = await client.wait_group(accepted.groups[0].group_id, timeout=60)
    assert view.done
    return [m.result.model_dump(mode="json") for m in view.rollouts if m.result is not None]


def sampled_by(fake: FakeVLLM, turn: dict):
    """A call that sampled ``turn``: the logprobs are a hash of the prompt and the weights,
    so the calls that answered exactly these all named the same model."""
    calls = [c for c in fake.calls if c.logprobs == turn["logprobs"] and c.output_ids == turn["output_ids"]]
    assert calls and len({c.request["model"] for c in calls}) == 1
    return calls[0]


async def test_a_lora_sync_mid_batch_reaches_vllm_and_every_later_turn_names_the_adapter(make_api, tok, tmp_path):
    async with FakeVLLM(tok, latency=0.2, runtime_lora=True, dev_mode=True) as fake:
        fake.replies = policy_of(fake)
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        before = await rollouts(client, 2)
        assert all(r["reward"] == 0.0 for r in before)
        fake.latency = 300.0  # the first calls of the batch stay in flight until aborted...
        submitted = await client.submit([{**TASK, "n": 6}], **SETTINGS)
        await eventually(lambda: any(c.status is None for c in fake.calls), timeout=30, what="calls in flight")
        fake.latency = 0.2  # ...and those sent after the resume answer as before
        sync = AsyncWeightSync(client, mode="abort")
        report = await sync.update(LoRA("policy", adapter(tmp_path)), policy_version=2)
        view = await client.wait_group(submitted.groups[0].group_id, timeout=60)
        after = await rollouts(client, 2)
        listing = await client.list_backends()
        await client.aclose()
    assert report.loaded.ok and report.resumed.policy_version == 2
    assert report.loaded.models == {listing.backends[0].name: "policy"}
    assert report.paused.aborted > 0  # the sync landed mid-batch
    assert listing.backends[0].model_extra is not None
    assert listing.backends[0].model_extra["lora"] == "policy"
    mid = [m.result.model_dump(mode="json") for m in view.rollouts if m.result is not None]
    turns = [t for r in before + mid + after for t in r["trajectory"]["turns"]]
    versions = set()
    for turn in turns:
        call = sampled_by(fake, turn)
        model = call.request["model"]
        # stamped with exactly the version whose weights sampled it
        assert (turn["policy_version"], model) in ((1, "fake-model"), (2, "policy"))
        assert turn["logprobs"] == fake_logprobs(call.prompt_ids, len(turn["logprobs"]), None, fake.weights_of(model))
        versions.add(turn["policy_version"])
    assert versions == {1, 2}
    assert all(r["reward"] == 1.0 for r in after)
    assert all(t["policy_version"] == 2 for r in after for t in r["trajectory"]["turns"])
    # after the load, no request to this server named the base model again
    loaded_at = next(i for i, c in enumerate(fake.calls) if c.request.get("model") == "policy")
    assert all(c.request["model"] == "policy" for c in fake.calls[loaded_at:])
    assert fake.weight_loads == [("lora:policy", adapter_path(tmp_path))]


def adapter_path(tmp_path: Path, name: str = "adapter") -> str:
    return str(tmp_path / name)


async def test_a_failed_load_is_typed_leaves_generation_paused_and_the_version_unbumped(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake:
        fake.replies = policy_of(fake)
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        sync = AsyncWeightSync(client)
        with pytest.raises(WeightLoadFailed) as failed:
            await sync.update(LoRA("policy", str(tmp_path / "missing")), policy_version=2)
        error = failed.value
        assert error.paused and error.policy_version == 1
        assert "No adapter found" in error.outcomes[next(iter(error.outcomes))]
        status = await client.list_backends()
        assert status.router.paused and status.router.policy_version == 1
        # a rollout submitted now waits: nothing samples while the weights are unsure
        accepted = await client.submit([{**TASK, "n": 1}], **SETTINGS)
        await asyncio.sleep(0.3)  # sleep-ok: observation window for calls sent while paused
        assert not fake.calls
        report = await sync.update(LoRA("policy", adapter(tmp_path)), policy_version=2)
        view = await client.wait_group(accepted.groups[0].group_id, timeout=60)
        await client.aclose()
    assert report.resumed.policy_version == 2
    result = view.rollouts[0].result
    assert result is not None and result.reward == 1.0
    assert [t.policy_version for t in result.trajectory.turns] == [2]
    assert [c.request["model"] for c in fake.calls] == ["policy"]


async def test_a_server_without_runtime_lora_says_how_to_serve_it(make_api, tok, tmp_path):
    async with FakeVLLM(tok) as fake:  # no VLLM_ALLOW_RUNTIME_LORA_UPDATING: no route
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        with pytest.raises(WeightLoadFailed, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            await AsyncWeightSync(client).update(LoRA("policy", adapter(tmp_path)), 2)
        await client.aclose()


async def test_a_backend_that_cannot_load_weights_refuses_before_anything_loads(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True) as fake, FakeLlamaCpp(tok) as llama:
        service, _ = await make_api([fake.url, f"llamacpp={llama.url}"])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        with pytest.raises(WeightsRefused, match="llamacpp") as refused:
            await AsyncWeightSync(client).update(LoRA("policy", adapter(tmp_path)), 2)
        assert not refused.value.paused and refused.value.policy_version == 1
        status = await client.list_backends()
        await client.aclose()
    assert not fake.weight_loads  # nothing was loaded anywhere
    assert not status.router.paused and status.router.policy_version == 1


async def test_a_name_the_server_would_refuse_fails_before_generation_is_paused(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True) as fake:
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        with pytest.raises(ValidationError, match="weights.name"):
            await AsyncWeightSync(client).update(LoRA("my adapter", adapter(tmp_path)), 2)
        status = await client.list_backends()
        await client.aclose()
    assert not fake.weight_loads
    assert not status.router.paused and status.router.policy_version == 1


async def test_weights_load_only_while_paused_and_a_bad_body_names_its_field(make_api, tok, tmp_path):
    async with FakeVLLM(tok, runtime_lora=True) as fake:
        _, http = await make_api([fake.url])
        body = {"weights": {"kind": "lora", "name": "policy", "path": adapter(tmp_path)}}
        r = await http.post("/v1/llm/weights", json=body)
        assert r.status_code == 409 and "not paused" in r.json()["detail"]
        r = await http.post("/v1/llm/weights", json={"weights": {"kind": "lora", "name": "p"}})
        assert r.status_code == 422 and "weights.path" in r.text
        r = await http.post("/v1/llm/weights", json={"weights": {"kind": "everything", "path": "/x"}})
        assert r.status_code == 422 and "weights" in r.text
    assert not fake.weight_loads


async def test_full_weights_reload_in_vllm_dev_mode(make_api, tok, tmp_path):
    checkpoint = tmp_path / "step2"
    checkpoint.mkdir()
    async with FakeVLLM(tok, dev_mode=True, runtime_lora=True, replies="\\boxed{4}") as fake:
        service, _ = await make_api([fake.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        report = await AsyncWeightSync(client).update(FullWeights(str(checkpoint)), 2)
        result = (await rollouts(client, 1))[0]
        with pytest.raises(WeightLoadFailed, match="HTTP 500.*collective_rpc method failed"):
            await AsyncWeightSync(client).update(FullWeights(str(tmp_path / "gone")), 3)
        await client.aclose()
    assert report.loaded.models == {service.router.list()[0]["name"]: "fake-model"}
    assert fake.weight_loads == [("full", str(checkpoint))]
    assert fake.pauses == ["wait", "wait"] and not fake.paused  # the engine resumed both times
    assert fake.prefix_cache_resets == 1  # after the load that succeeded, while paused
    turn = result["trajectory"]["turns"][0]
    call = sampled_by(fake, turn)
    assert turn["policy_version"] == 2 and call.request["model"] == "fake-model"
    assert turn["logprobs"] == fake_logprobs(call.prompt_ids, len(turn["logprobs"]), None, f"full:{checkpoint}#1")


async def test_full_weights_into_sglang_carry_the_policy_version(make_api, tok, tmp_path):
    checkpoint = tmp_path / "step7"
    checkpoint.mkdir()
    async with FakeSGLang(tok, replies="\\boxed{4}") as fake:
        service, _ = await make_api([f"sglang={fake.url}"])
        client = rollserve_client(service)
        await client.resume(policy_version=6)
        with pytest.raises(WeightsRefused, match="cannot load lora"):
            await AsyncWeightSync(client).update(LoRA("policy", adapter(tmp_path)), 7)
        report = await AsyncWeightSync(client).update(FullWeights(str(checkpoint)), 7)
        result = (await rollouts(client, 1))[0]
        await client.aclose()
    assert report.loaded.ok and fake.weight_version == "7"
    turn = result["trajectory"]["turns"][0]
    assert turn["policy_version"] == 7
    assert turn["logprobs"] == fake_logprobs(
        fake.calls[0].prompt_ids, len(turn["logprobs"]), None, f"full:{checkpoint}#1"
    )


async def test_a_server_added_after_a_lora_sync_names_the_adapter_not_the_base_model(make_api, tok, tmp_path):
    """A vLLM server added at run time once the policy is an adapter (started with it, as
    `--lora-modules policy=DIR` does) samples the adapter, not the base model, under the
    new version; a server that cannot serve an adapter is refused, not added."""
    path = adapter(tmp_path)
    async with (
        FakeVLLM(tok, runtime_lora=True, dev_mode=True) as first,
        FakeVLLM(tok, runtime_lora=True) as second,
        FakeLlamaCpp(tok) as llama,
    ):
        first.replies = policy_of(first)
        second.replies = policy_of(second)
        service, http = await make_api([first.url])
        client = rollserve_client(service)
        await client.resume(policy_version=1)
        await AsyncWeightSync(client).update(LoRA("policy", path), policy_version=2)
        async with httpx.AsyncClient() as direct:  # the new server serves the adapter
            loaded = await direct.post(
                f"{second.url}/v1/load_lora_adapter", json={"lora_name": "policy", "lora_path": path}
            )
            assert loaded.status_code == 200
        r = await http.post("/v1/llm/backends", json={"url": second.url, "name": "second"})
        assert r.status_code == 201, r.text
        r = await http.post("/v1/llm/backends", json={"url": llama.url, "name": "llama", "kind": "llamacpp"})
        assert r.status_code == 409 and "cannot serve the LoRA adapter 'policy'" in r.text
        (await http.delete(f"/v1/llm/backends/{service.router.list()[0]['name']}")).raise_for_status()
        results = await rollouts(client, 3)
        names = [b["name"] for b in service.router.list()]
        await client.aclose()
    assert names == ["second"]
    assert second.calls and {c.request["model"] for c in second.calls} == {"policy"}
    turns = [t for r in results for t in r["trajectory"]["turns"]]
    assert turns and {t["policy_version"] for t in turns} == {2}
    assert {t["backend"] for t in turns} == {"second"}
    assert all(r["reward"] == 1.0 for r in results)

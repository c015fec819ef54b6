"""SIGKILL the server after a LoRA weight sync, restart it on the same state dir: the
inference server still holds the adapter, so the restarted server must name it and
stamp the version the trainer resumed with, not sample the base model unversioned."""

import json
from pathlib import Path

import httpx

from rollserve.client import Client
from rollserve.client.weights import LoRA, WeightSync

TASK = {"data_source": "math", "n": 3, "instance": {"question": "What is 2 + 2?", "answer": "4"}}


def adapter(tmp_path: Path) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return str(folder)


def test_a_restarted_server_names_the_adapter_in_force_and_its_version(server_factory, fake_llm_thread, tmp_path):
    fake = fake_llm_thread(replies="The answer is \\boxed{4}.", runtime_lora=True, dev_mode=True)
    state = tmp_path / "state"
    path = adapter(tmp_path)
    first = server_factory("--backend", fake.url, state_dir=state).start()
    with Client(first.url) as client:
        WeightSync(client).update(LoRA("policy", path), policy_version=7)
        assert client.status().llm.lora == "policy"
    first.kill()  # no shutdown code runs; the vLLM server keeps the adapter loaded
    assert fake.lora_adapters == {"policy": path}
    before = len(fake.calls)

    second = server_factory("--backend", fake.url, state_dir=state).start()
    with Client(second.url) as client:
        llm = client.status().llm
        group = client.submit([TASK]).groups[0]
        view = client.wait_group(group.group_id, timeout=120)
        backends = httpx.get(f"{second.url}/v1/llm/backends", timeout=10).json()
    assert llm.lora == "policy" and llm.policy_version == 7
    assert llm.last_load is not None
    assert (llm.last_load.kind, llm.last_load.name, llm.last_load.path) == ("lora", "policy", path)
    assert llm.last_load.policy_version == 7 and llm.last_load.failed == []
    assert [b["lora"] for b in backends["backends"]] == ["policy"]
    assert view.done
    results = [m.result for m in view.rollouts if m.result is not None]
    assert len(results) == 3 and all(r.status == "completed" for r in results)
    turns = [t for r in results for t in r.trajectory.turns]
    assert turns and {t.policy_version for t in turns} == {7}
    after = fake.calls[before:]
    assert after and {c.request["model"] for c in after} == {"policy"}

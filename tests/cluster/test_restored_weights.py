"""A restarted head on a state dir whose server had loaded a LoRA adapter (the inference
servers still hold it): every node worker it starts names the adapter and stamps the
restored policy version from its first call, as the head's own router does."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")

from rollserve.cluster import executor as executor_module  # noqa: E402
from rollserve.cluster.protocol import RayConfig  # noqa: E402
from rollserve.engine import weights_file  # noqa: E402
from rollserve.llm.routing.in_force import WeightsInForce  # noqa: E402
from rollserve.server import ServerConfig, Service  # noqa: E402
from tests.cluster.test_executor_control import INFO, healthy_workers, scan  # noqa: E402


async def test_a_restarted_head_starts_its_workers_on_the_restored_adapter_and_version(killed, monkeypatch, tmp_path):
    config = ServerConfig(state_dir=tmp_path / "state", ray=RayConfig(address="auto"), backends=["http://127.0.0.1:9"])
    weights_file.write(weights_file.weights_path(config.db_path), WeightsInForce(policy_version=7, lora="policy"))
    service = Service(config)
    assert service.cluster is not None
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [INFO])
    made = healthy_workers(service.cluster)
    await scan(service.cluster)
    (actor,) = made
    assert (service.router.lora, service.router.policy_version) == ("policy", 7)
    assert actor.settings["lora"] == "policy" and actor.settings["policy_version"] == 7

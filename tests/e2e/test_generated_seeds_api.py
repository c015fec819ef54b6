"""Generated (reasoning-gym) instances through the HTTP API: seeded with the public
seed salted by a secret the store keeps (handlers/seeds.py), so a policy that can run
the generator cannot rebuild its entry from the seed; the same store rebuilds the same
entry (a restart included), another store another one; each result records the salt
and the generator's seed; ``public_seeds`` seeds with the public seed as it is."""

from __future__ import annotations

import re

import httpx
import reasoning_gym

from rollserve.api.app import create_app
from rollserve.handlers.seeds import salted_seed
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM

TASK = {"data_source": "math", "instance": {"dataset": "basic_arithmetic", "seed": 7780, "index": 2}}


class Server:
    """A service on ``state_dir`` and an in-process HTTP client to it."""

    def __init__(self, state_dir, backend: str, **settings):
        self.config = ServerConfig(state_dir=state_dir, backends=[backend], **settings)

    async def __aenter__(self) -> httpx.AsyncClient:
        self.service = Service(self.config)
        await self.service.start()
        app = create_app(self.service, manage_lifecycle=False)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollserve", timeout=30)
        return self.client

    async def __aexit__(self, *exc) -> None:
        await self.client.aclose()
        await self.service.stop()


async def run(client: httpx.AsyncClient) -> tuple[str, dict]:
    """One rollout of TASK: (the question the policy was asked, the evaluation)."""
    r = await client.post("/v1/rollouts", json={"tasks": [TASK]})
    assert r.status_code == 202, r.text
    (rid,) = r.json()["groups"][0]["rollout_ids"]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
    assert view["done"], view
    result = view["result"]
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    (question,) = [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "user"]
    return question, result["evaluation"]


def public_entry(seed: int) -> dict:
    """The entry anyone rebuilds from the public seed (what a policy in the sandbox did)."""
    return reasoning_gym.create_dataset("basic_arithmetic", seed=seed, size=500)[TASK["instance"]["index"]]


async def test_a_generated_instance_is_not_the_one_its_public_seed_makes(tmp_path):
    async with FakeVLLM("smollm2", replies=["\\boxed{0}"], latency=0.0) as llm:
        async with Server(tmp_path / "a", llm.url) as client:
            first, details = await run(client)
            again, _ = await run(client)
        async with Server(tmp_path / "a", llm.url) as client:  # the same store, restarted
            restarted, details_restarted = await run(client)
        async with Server(tmp_path / "b", llm.url) as client:  # another store
            other, details_other = await run(client)
    public = public_entry(7780)["question"]
    assert public not in first and public not in other
    assert first == again == restarted and other != first
    # What the result records rebuilds the entry the policy was asked.
    salt = details["seed_salt"]
    assert re.fullmatch(r"[0-9a-f]{64}", salt) and details["seed"] == 7780
    assert details["generator_seed"] == salted_seed(7780, salt) != 7780
    assert public_entry(details["generator_seed"])["question"] in first
    assert details_restarted["seed_salt"] == salt and details_other["seed_salt"] != salt
    assert public_entry(details_other["generator_seed"])["question"] in other


async def test_public_seeds_seed_the_generator_with_the_public_seed(tmp_path):
    async with FakeVLLM("smollm2", replies=["\\boxed{0}"], latency=0.0) as llm:
        async with Server(tmp_path / "state", llm.url, public_seeds=True) as client:
            question, details = await run(client)
    assert public_entry(7780)["question"] in question
    assert details["seed_salt"] is None and details["seed"] == details["generator_seed"] == 7780

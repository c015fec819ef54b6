"""With --ray (an executor that has nodes), a `gateway` rollout whose harness would run
outside the sandbox is refused at submit with a 422 naming instance.command: its
session lives in a node's worker, which the head's /v1/gateway routes cannot reach
(it would sit until its RUN limit). A harness run in the sandbox (command) is taken."""

from __future__ import annotations

from rollserve.contract import NodeStatus
from rollserve.engine.executor import LocalExecutor


class WithNodes(LocalExecutor):
    """Runs stages here but, like ``cluster.RayExecutor``, reports nodes (none yet)."""

    def nodes(self) -> list[NodeStatus] | None:
        return []


async def test_with_nodes_a_harness_outside_the_sandbox_is_refused_naming_the_field(make_api):
    service, client = await make_api()
    body = {
        "tasks": [
            {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}},
            {"data_source": "gateway", "instance": {"answer": "x"}},
        ]
    }
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text  # one machine
    service.engine.executor = WithNodes(service.router)
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 422, r.text
    assert "tasks[1].instance.command" in r.text and "--ray" in r.text
    body["tasks"][1]["instance"]["command"] = "true"
    assert (await client.post("/v1/rollouts", json=body)).status_code == 202, r.text

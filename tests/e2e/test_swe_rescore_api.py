"""Re-scoring stored swe results from their stored candidate patch, through the HTTP
API (``POST /v1/results/rescore``), on a bundled swe-mini instance with the scripted
policy and real bubblewrap sandboxes: a stored gold and empty batch re-scored gives 1
and 0 again as new results beside the old ones, samples nothing, and a server started
again over the same store with other swe grader options grades with those (no second
runner; the empty patch's tests run); a result whose EVAL never ended (masked, no
patch) is refused naming it."""

from __future__ import annotations

import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.e2e.test_swe_api import INSTANCES, llm, tagged  # noqa: F401 (the policy fixture)

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


async def finished(client, rid: str) -> dict:
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 300})).json()
    assert view["done"], view
    return view["result"]


async def rescore(client, ids: list[str]) -> list[dict]:
    r = await client.post("/v1/results/rescore", json={"result_ids": ids})
    assert r.status_code == 200, r.text
    assert r.json()["scoring"] == "outcome"
    return [await finished(client, n["id"]) for n in r.json()["results"]]


async def test_swe_results_rescored_from_their_stored_patch(make_api, llm):  # noqa: F811
    service, client = await make_api([llm.url], init_workers=3, eval_workers=3)
    row = INSTANCES[0]
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [
                {"data_source": "swe", "instance": tagged(row, "gold")},
                {"data_source": "swe", "instance": tagged(row, "nothing")},
                # EVAL past its bound: masked, no evaluation, no patch kept
                {
                    "data_source": "swe",
                    "instance": {**tagged(row, "gold"), "test_cmd": "sleep 987.67"},
                    "timeouts": {"eval": 3.0},
                },
            ],
            "sampling": {"max_tokens": 4096},
            "agent": {"max_turns": 12},
        },
    )
    assert r.status_code == 202, r.text
    gold, empty, masked = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
    old = [await finished(client, rid) for rid in (gold, empty, masked)]
    assert [o["reward"] for o in old[:2]] == [1.0, 0.0], [o["failure"] for o in old]
    assert old[0]["evaluation"]["git_patch"] == row["patch"]  # kept in full
    assert old[0]["evaluation"]["recheck"]["agreed"] is True
    assert old[1]["evaluation"]["reason"] == "empty patch"
    assert old[2]["mask"] and old[2]["evaluation"] is None
    sampled = len(llm.calls)
    after = (await client.get("/v1/results", params={"after": 0})).json()["next"]

    new = await rescore(client, [gold, empty])
    assert [n["reward"] for n in new] == [1.0, 0.0]
    assert [n["rescored_from"] for n in new] == [gold, empty]
    assert {n["id"] for n in new}.isdisjoint({gold, empty})
    assert all(n["scoring"] == "outcome" and not n["mask"] for n in new)
    assert new[0]["evaluation"]["recheck"]["agreed"] is True  # the same grader, all of it
    assert new[0]["evaluation"]["canary"] == "failed"
    assert new[1]["evaluation"]["reason"] == "empty patch"
    page = (await client.get("/v1/results", params={"after": after})).json()
    assert {res["id"] for res in page["results"]} == {n["id"] for n in new}
    assert len(llm.calls) == sampled  # nothing sampled
    again = [await finished(client, rid) for rid in (gold, empty)]
    assert [(a["reward"], a["evaluation"], a["scoring"]) for a in again] == [
        (o["reward"], o["evaluation"], None) for o in old[:2]
    ]

    # refused, naming the result, and nothing written
    r = await client.post("/v1/results/rescore", json={"result_ids": [gold, masked]})
    assert r.status_code == 422, r.text
    assert "result_ids[1]" in r.text and masked in r.text and "not completed" in r.text
    assert (await client.get("/v1/results", params={"after": page["next"]})).json()["results"] == []

    # the server again over the same store, with other grader options: they grade
    _, changed = await make_api(
        [llm.url],
        server={
            "store_path": service.config.db_path,
            "handler_options": {"swe": {"recheck": False, "empty_patch": "run"}},
        },
    )
    new = await rescore(changed, [gold, empty])
    assert [n["reward"] for n in new] == [1.0, 0.0]
    assert "recheck" not in new[0]["evaluation"]  # no second runner now
    assert new[1]["evaluation"]["tests_ran"] is True  # the empty patch's tests ran
    assert any(t["kind"] == "FAIL_TO_PASS" and not t["ok"] for t in new[1]["evaluation"]["tests"])
    assert len(llm.calls) == sampled

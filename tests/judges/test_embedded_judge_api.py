"""One real judge: the embedded SmolLM2 model grading a small set end to end through
the HTTP API (the policy is the scripted double). Its scores are whatever the small
model says; the run is checked: every rollout completes, every judge call is recorded
(prompt, reply, latency), a parsed score is inside the scale, and the reward is the
stated blend of outcome and score (the scale's lowest, unparsed, where the model gave
no valid score line)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="the embedded model needs extra 'local' (llama-cpp-python)")

from rollserve.testing import FakeVLLM  # noqa: E402
from tests.judges.judge_doubles import TAG, math_task, results, submit  # noqa: E402

pytestmark = pytest.mark.embedded

REPLIES = {
    "a": "3 + 4 = \\boxed{7}",
    "b": "I think it is \\boxed{12}",
    "c": "7",
    "d": "The sum of 3 and 4 is \\boxed{7}.",
}


def policy(prompt_ids, prompt: str) -> str:
    return REPLIES[TAG.findall(prompt)[0]]


async def test_the_embedded_model_grades_a_small_set(make_api, tok):
    judge = (
        '{"name": "smol", "backend": {"kind": "embedded", "n_ctx": 2048}, '
        '"max_tokens": 40, "timeout": 300, "retries": 0}'
    )
    rubric = {"judges": ["smol"], "weight": 0.5, "on_failure": "outcome", "low": 0, "high": 10}
    async with FakeVLLM(tok, replies=policy) as pol:
        _, client = await make_api([pol.url], server={"judges": [judge], "rubrics": {"smol": rubric}})
        # EVAL waits for the judge: four calls queue on the one in-process model, so a
        # loaded machine needs more than math's default EVAL bound
        ids = await submit(
            client, [math_task(tag, {"rubric": "smol"}) for tag in REPLIES], timeouts={"eval": 600, "total": 1200}
        )
        found = await results(client, ids, wait=300)
        status = (await client.get("/v1/status")).json()
    assert all(r["status"] == "completed" and not r["mask"] for r in found), [
        (r["status"], r["failure"]) for r in found
    ]
    for result in found:
        judged = result["evaluation"]["judge"]
        (call,) = judged["calls"]
        assert call["judge"] == "smol" and call["seconds"] > 0 and call["reply"] is not None
        assert "BOUNDARY-" in call["prompt"]
        outcome = result["reward_components"]["outcome"]
        # a reply without a valid score line (a small model often writes none) counts
        # as the scale's lowest, unparsed: true; never a mask, never the outcome alone
        assert 0 <= call["score"] <= 10 and (not call["unparsed"] or call["score"] == 0)
        assert result["reward"] == pytest.approx(0.5 * outcome + 0.5 * call["score"] / 10)
    (smol,) = status["judges"]
    # each judge sample asks once per try (a reply without a score is asked again, and
    # the retry may parse): the calls the server counts are the tries the results record
    calls = [result["evaluation"]["judge"]["calls"][0] for result in found]
    assert smol["calls"]["ok"] == sum(call["tries"] for call in calls)
    assert smol["unparsed"] == sum(call["unparsed"] for call in calls)
    assert smol["backend"]["kind"] == "embedded"
    assert all(c.route != "/v1/chat/completions" for c in pol.calls)  # the policy: no judge call


async def test_an_answer_over_the_embedded_judges_window_scores_lowest_not_masked(make_api, tok):
    """The in-process judge refuses a prompt over its context (not evaluated), as a
    server's window does: the policy's doing, so the scale's lowest, never the mask
    of a judge not reached (on_failure "mask")."""
    judge = (
        '{"name": "smol", "backend": {"kind": "embedded", "n_ctx": 1024}, '
        '"max_tokens": 8, "timeout": 300, "retries": 2}'
    )
    rubric = {"judges": ["smol"], "weight": 0.5, "on_failure": "mask"}
    long = "\\boxed{7}\n" + "padding " * 3000
    async with FakeVLLM(tok, replies=long) as pol:
        _, client = await make_api([pol.url], server={"judges": [judge], "rubrics": {"smol": rubric}})
        (found,) = await results(
            client,
            await submit(
                client,
                [math_task("a", {"rubric": "smol"})],
                sampling={"max_tokens": 8000},
                timeouts={"eval": 600, "total": 1200},
            ),
            wait=300,
        )
    assert found["status"] == "completed" and not found["mask"], found["failure"]
    (call,) = found["evaluation"]["judge"]["calls"]
    assert call["unparsed"] is True and "refused the prompt" in call["error"], call
    assert found["reward"] == pytest.approx(0.5)  # outcome 1, the judge's lowest 0

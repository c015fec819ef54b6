"""Judge rewards through the HTTP API, with a scripted policy and scripted judges:
scores parsed, scaled, aggregated and blended as stated; a failing or hanging judge
masks or falls back as the rubric says (never a silent 0); judge traffic never reaches
the policy's backend and the policy's never reaches a judge; bad judge requests are
4xx naming the field."""

from __future__ import annotations

import json

import pytest

from rollserve.testing import FakeVLLM
from tests.judges.judge_doubles import TAG, graded_text, math_task, results, submit

POLICY = {"right": "3 + 4 = \\boxed{7}", "wrong": "3 + 4 = \\boxed{8}", "think": "Let me think first."}


def policy(prompt_ids, prompt: str) -> str:
    tag = TAG.findall(prompt)[0]
    if tag == "steps":  # process mode: think once, then answer
        return POLICY["right"] if prompt.count("<|im_start|>assistant") > 1 else POLICY["think"]
    return POLICY[tag]


def judge_by_answer(high: int, low: int):
    """Scores the graded text: ``high`` when it holds the right boxed answer."""

    def reply(prompt_ids, prompt: str) -> str:
        text = graded_text(prompt)
        last = text.rsplit("[assistant]", 1)[-1]
        score = high if "\\boxed{7}" in last else low
        return f"The answer was checked.\nSCORE: {score}"

    return reply


@pytest.fixture
async def doubles(tok):
    async with (
        FakeVLLM(tok, replies=policy) as pol,
        FakeVLLM(tok, replies=judge_by_answer(8, 3), model="judge-a") as ja,
        FakeVLLM(tok, replies=judge_by_answer(2, 1), model="judge-b") as jb,
        FakeVLLM(tok, replies="I refuse to grade.") as bad,
        FakeVLLM(tok, replies="SCORE: 9", latency=600.0) as hang,
    ):
        yield pol, ja, jb, bad, hang


async def test_judge_rewards_parsed_scaled_aggregated_and_isolated(make_api, doubles):
    pol, ja, jb, bad, hang = doubles
    hanging = json.dumps({"name": "hang", "backend": hang.url, "timeout": 1, "retries": 1})
    # nothing listens on port 9 (discard): every call is a transport failure
    down = json.dumps({"name": "down", "backend": "http://127.0.0.1:9", "timeout": 5, "retries": 0})
    _, client = await make_api(
        [pol.url],
        server={
            "judges": [f"a={ja.url}/v1", f"b=openai_chat={jb.url}", f"bad={bad.url}", hanging, down],
            "rubrics": {
                "both-min": {"judges": ["a", "b"], "aggregate": "min"},
                "both-mean": {"judges": ["a", "b"], "samples": 2},
                "half": {"judges": ["a"], "weight": 0.5},
                "process": {"judges": ["a"], "mode": "process", "weight": 0.5},
                "bad-mask": {"judges": ["bad"]},
                "down-mask": {"judges": ["down"]},
                "bad-outcome": {"judges": ["bad"], "on_failure": "outcome"},
                "hang": {"judges": ["hang"], "on_failure": "outcome"},
            },
        },
    )
    tasks = [
        math_task("right", {"rubric": "default"}),  # the first judge (a), weight 1
        math_task("wrong", {"rubric": "half"}),
        math_task("right", {"rubric": "both-min"}),
        math_task("right", {"rubric": "both-mean"}),
        math_task("steps", {"rubric": "process"}),
        math_task("right", {"rubric": "bad-mask"}),
        math_task("wrong", {"rubric": "bad-outcome"}),
        math_task("right", {"rubric": "hang"}),
        math_task("right"),  # no judge: the outcome alone
        math_task("right", {"rubric": "down-mask"}),
    ]
    ids = await submit(client, tasks, agent={"max_turns": 3})
    (default, half, both_min, both_mean, process, unparsed, fallback, hung, plain, masked) = await results(client, ids)

    assert default["reward"] == pytest.approx(0.8)  # 8 on 0..10, weight 1
    comps = default["reward_components"]
    assert comps["judge"] == pytest.approx(0.8) and comps["outcome"] == 1.0
    assert comps["correctness"] == 1.0 and comps["format"] == 1.0
    (call,) = default["evaluation"]["judge"]["calls"]
    assert call["judge"] == "a" and call["score"] == 8 and call["reply"].endswith("SCORE: 8")
    assert "\\boxed{7}" in call["prompt"] and call["seconds"] >= 0
    # wrong answer: outcome 0, judge 3/10, blended half and half
    assert half["reward"] == pytest.approx(0.5 * 0.0 + 0.5 * 0.3)
    assert both_min["reward"] == pytest.approx(0.2)  # min(8, 2) / 10
    assert len(both_mean["evaluation"]["judge"]["calls"]) == 4  # 2 judges x 2 samples
    assert both_mean["reward"] == pytest.approx(0.5)  # mean(8, 8, 2, 2) / 10
    # process: the first call (no answer) 3, the second 8; mean 0.55, blended with 1.0
    judged = process["evaluation"]["judge"]
    assert judged["turn_scores"] == [pytest.approx(0.3), pytest.approx(0.8)]
    assert process["reward"] == pytest.approx(0.5 * 1.0 + 0.5 * 0.55)
    assert process["reward_components"]["judge_process"] == pytest.approx(0.55)
    # a judge unreachable: masked (infra, never scored), as the rubric says
    assert masked["mask"] and masked["reward"] is None and masked["failure"]["kind"] == "infra"
    assert "judge" in masked["failure"]["message"]
    # a judge that answered without a score: asked again, then the scale's lowest
    # score, whatever on_failure says (never a mask, never the outcome alone)
    assert unparsed["mask"] is False and unparsed["reward"] == 0.0
    (call,) = unparsed["evaluation"]["judge"]["calls"]
    assert call["unparsed"] is True and call["score"] == 0 and call["tries"] == 2
    assert unparsed["evaluation"]["judge"]["unparsed"] is True
    assert unparsed["reward_components"]["judge"] == 0.0
    assert fallback["mask"] is False and fallback["reward"] == 0.0
    assert fallback["evaluation"]["judge"]["unparsed"] is True
    assert fallback["reward_components"]["judge"] == 0.0
    # a hanging judge is bounded by its timeout (each try), then falls back
    assert hung["reward"] == 1.0 and hung["evaluation"]["judge"]["failed"] is True
    assert any("no reply in 1 s" in e for e in hung["evaluation"]["judge"]["errors"])
    assert plain["reward"] == 1.0 and "judge" not in (plain["evaluation"] or {})
    assert set(plain["reward_components"]) == {"correctness", "format"}

    # judge calls are recorded in the evaluation, never in the trajectory
    for result in (default, process):
        text = str(result["trajectory"]["messages"])
        assert "SCORE" not in text and "BOUNDARY" not in text
    # isolation: the policy's backend saw no judge prompt, the judges no policy call
    assert pol.calls and all(c.route != "/v1/chat/completions" for c in pol.calls)
    assert all("BOUNDARY" not in pol.tok.decode(c.prompt_ids) for c in pol.calls if c.prompt_ids)
    for judge in (ja, jb, bad):
        assert judge.calls and all(c.route == "/v1/chat/completions" for c in judge.calls)
    backends = (await client.get("/v1/llm/backends")).json()
    assert [b["name"] for b in backends["backends"]] == [
        b["name"] for b in backends["backends"] if "judge" not in b["name"]
    ]
    # the judges' state and metrics
    status = (await client.get("/v1/status")).json()
    by_name = {j["name"]: j for j in status["judges"]}
    assert set(by_name) == {"a", "b", "bad", "hang", "down"}
    assert by_name["bad"]["unparsed"] == 2 and by_name["a"]["unparsed"] == 0
    assert by_name["a"]["calls"]["ok"] >= 7 and by_name["hang"]["calls"]["timeout"] == 2
    assert by_name["hang"]["healthy"] is False
    metrics = (await client.get("/metrics")).text
    assert 'rollserve_judge_calls_total{judge="hang",outcome="timeout"} 2.0' in metrics
    assert 'rollserve_judge_latency_seconds_count{judge="a"}' in metrics


async def test_a_hanging_judge_with_default_limits_falls_back_as_the_rubric_says(make_api, doubles):
    """A judge that never answers, with its default timeout (60 s a try, two tries)
    and math's default EVAL limit (30 s): the judges are bounded by the EVAL stage's
    time, so on_failure "outcome" gives the outcome reward, unmasked, the evaluation
    saying the judges timed out (never a masked EVAL timeout that hides the judge);
    on_failure "mask" masks it as a judge failure."""
    pol, *_, hang = doubles
    _, client = await make_api(
        [pol.url],
        server={
            "judges": [f"hang={hang.url}"],
            "rubrics": {"fallback": {"judges": ["hang"], "on_failure": "outcome"}, "masking": {"judges": ["hang"]}},
        },
    )
    ids = await submit(client, [math_task("right", {"rubric": "fallback"}), math_task("right", {"rubric": "masking"})])
    fallback, masked = await results(client, ids)
    assert fallback["status"] == "completed" and fallback["mask"] is False, fallback["failure"]
    assert fallback["reward"] == 1.0 and fallback["failure"] is None
    judged = fallback["evaluation"]["judge"]
    assert judged["failed"] is True and judged["fallback"] == "outcome"
    assert any("judges timed out" in e for e in judged["errors"]), judged["errors"]
    assert masked["mask"] is True and masked["reward"] is None
    assert masked["failure"]["stage"] == "eval" and masked["failure"]["kind"] == "infra"
    assert "judges timed out" in masked["failure"]["message"], masked["failure"]


async def test_a_paused_policy_does_not_pause_the_judges(make_api, doubles):
    """The policy's pause never reaches a judge: while the policy is paused a judge
    still grades (a re-score with it, which samples nothing), and the judge's health
    is its own."""
    pol, ja, *_ = doubles
    _, client = await make_api([pol.url], server={"judges": [f"a={ja.url}"]})
    ids = await submit(client, [math_task("right", {"rubric": "default"})])
    (first,) = await results(client, ids)
    assert first["reward"] == pytest.approx(0.8)
    graded, sampled = len(ja.calls), len(pol.calls)
    assert (await client.post("/v1/llm/pause", json={"mode": "abort"})).status_code == 200
    status = (await client.get("/v1/status")).json()
    assert status["llm"]["paused"] is True
    r = await client.post("/v1/results/rescore", json={"result_ids": ids, "judge": {"rubric": "default"}})
    assert r.status_code == 200, r.text
    (again,) = r.json()["results"]
    assert again["reward"] == pytest.approx(0.8) and again["mask"] is False
    assert len(ja.calls) == graded + 1 and len(pol.calls) == sampled
    status = (await client.get("/v1/status")).json()
    assert status["llm"]["paused"] is True  # still paused: the judge answered anyway
    assert [j["healthy"] for j in status["judges"]] == [True]
    await client.post("/v1/llm/resume", json={})


@pytest.mark.parametrize(
    ("judge", "field"),
    [
        ({"rubric": "nope"}, "tasks[0].judge.rubric"),
        ({"rubric": {"judges": ["nobody"]}}, "tasks[0].judge.rubric.judges"),
        ({"rubric": {"low": 5, "high": 1}}, "tasks[0].judge.rubric"),
        ({"rubric": {"template": "no placeholder"}}, "tasks[0].judge.rubric"),
        ({"rubric": "default", "extra": 1}, "tasks[0].judge.extra"),
    ],
)
async def test_bad_judge_requests_are_4xx_naming_the_field(make_api, tok, judge, field):
    async with FakeVLLM(tok, replies=policy) as pol, FakeVLLM(tok, replies="SCORE: 1") as ja:
        _, client = await make_api([pol.url], server={"judges": [f"a={ja.url}"]})
        r = await client.post("/v1/rollouts", json={"tasks": [math_task("right", judge)]})
        assert 400 <= r.status_code < 500, r.text
        assert field in r.text, r.text
        assert not pol.calls  # nothing admitted, nothing sampled


async def test_no_judge_on_the_server_is_a_4xx(make_api, tok):
    async with FakeVLLM(tok, replies=policy) as pol:
        _, client = await make_api([pol.url])
        r = await client.post("/v1/rollouts", json={"tasks": [math_task("right")], "judge": {"rubric": "default"}})
        assert r.status_code in (400, 422), r.text
        assert "judge.rubric" in r.text and "no judge" in r.text


async def test_a_server_default_judge_applies_where_a_task_names_none(make_api, tok):
    async with (
        FakeVLLM(tok, replies=policy) as pol,
        FakeVLLM(tok, replies="ok\nSCORE: 6") as ja,
        FakeVLLM(tok, replies="SCORE: 1") as jb,
    ):
        _, client = await make_api(
            [pol.url],
            server={
                "judges": [f"a={ja.url}", f"b={jb.url}"],
                "default_judge": "bee",
                "rubrics": {"bee": {"judges": ["b"]}, "ay": {"judges": ["a"]}},
            },
        )
        ids = await submit(client, [math_task("right"), math_task("right", {"rubric": "ay"})])
        by_default, own = await results(client, ids)
    assert by_default["reward"] == pytest.approx(0.1)
    assert by_default["evaluation"]["judge"]["rubric"] == "bee"
    assert own["reward"] == pytest.approx(0.6)  # the task's own rubric wins

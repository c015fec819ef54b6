"""A policy probing the math reward's integer shortcut through the HTTP API: every
spelling of a number near the gold's scores exactly what math-verify says of it, the
plain integers on the event loop and the rest in the scoring pool."""

from __future__ import annotations

from rollserve.handlers.latex import verify_math_answer
from rollserve.testing import FakeVLLM

GOLD = "12"
# Boxed answers a reward-hacking policy might try against the gold 12.
ANSWERS = [
    "12",  # right
    "0012",  # leading zeros: the same integer
    "-12",  # the sign matters
    "13",
    "12.0",  # not a plain integer: math-verify decides
    "+12",
    "1 2",
    "1,2",
    "\u0661\u0662",  # Arabic-Indic 12: not ASCII digits, math-verify decides
    "12" * 10,  # 20 digits: past the shortcut's 18
    "000000000000000012",  # 18 digits
    "-0",
]


def _question(i: int) -> str:
    return f"Question {i}: what is 7 + 5?"


def policy(prompt_ids: list[int], prompt: str) -> str:
    for i, answer in enumerate(ANSWERS):
        if _question(i) in prompt:
            return f"The answer is \\boxed{{{answer}}}."
    return "no idea"


async def test_every_spelling_of_a_number_scores_what_math_verify_says(make_api):
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as llm:
        _, client = await make_api([llm.url])
        tasks = [
            {"data_source": "math", "instance": {"question": _question(i), "answer": GOLD}} for i in range(len(ANSWERS))
        ]
        r = await client.post("/v1/rollouts", json={"tasks": tasks})
        assert r.status_code == 202, r.text
        ids = [g["rollout_ids"][0] for g in r.json()["groups"]]
        rewards, methods = {}, {}
        for answer, rid in zip(ANSWERS, ids, strict=True):
            view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()
            assert view["done"], view
            result = view["result"]
            assert result["status"] == "completed" and not result["mask"], result
            assert result["evaluation"]["extracted"] == answer
            rewards[answer] = result["reward"]
            methods[answer] = result["evaluation"]["method"]
    assert rewards["12"] == 1.0 and rewards["0012"] == 1.0 and rewards["000000000000000012"] == 1.0
    assert rewards["-12"] == 0.0 and rewards["13"] == 0.0 and rewards["12" * 10] == 0.0
    for answer, reward in rewards.items():
        assert reward == (1.0 if verify_math_answer(answer, GOLD) else 0.0), answer
    # The evaluation says what decided: the shortcut only for two plain integers.
    integers = {"12", "0012", "-12", "13", "000000000000000012", "-0"}
    assert methods == {answer: "integer" if answer in integers else "math-verify" for answer in ANSWERS}

"""StemHandler: instance shapes, answer extraction, scoring, retries, the bundled set,
and the whole pipeline through the API."""

from __future__ import annotations

import re

import pytest

from rollserve.datasets import bundled_rows
from rollserve.handlers.base import AgentHandler, HandlerContext, InvalidInstance
from rollserve.handlers.registry import HandlerRegistry
from rollserve.handlers.scoring import ScoringPool
from rollserve.handlers.stem.answers import (
    Reading,
    extract_answer,
    is_numeric_answer,
    normalize_text,
    numbers_match,
    parse_number,
    read_answer,
    score_stem_answer,
)
from rollserve.handlers.stem.handler import StemEnv, StemHandler, gpqa_order, prepare
from rollserve.testing import FakeVLLM

MMLU = {
    "question": "What is the capital of France?",
    "choices": ["London", "Paris", "Rome", "Berlin"],
    "answer": 1,
    "subject": "geography",
}
GPQA = {
    "Question": "Which particle mediates the electromagnetic force?",
    "Correct Answer": "Photon",
    "Incorrect Answer 1": "Gluon",
    "Incorrect Answer 2": "W boson",
    "Incorrect Answer 3": "Graviton",
    "Subdomain": "Particle Physics",
}
NUMBER = {"question": "What is the speed of light in m/s?", "answer": "3.00e8"}
EXACT = {"question": "What is the chemical symbol of sodium?", "answer": "Na"}
CHOICE_SPEC = {"kind": "choice", "choices": ["London", "Paris", "Rome", "Berlin"], "gold": "B"}


def test_is_an_agent_handler_and_registered():
    handler = StemHandler(ctx=None)
    assert isinstance(handler, AgentHandler) and handler.name == "stem"
    registry = HandlerRegistry(discover=False)
    assert registry.handler_class("stem") is StemHandler


# --- validation ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "instance, field",
    [
        ("not a dict", "instance"),
        ({}, "instance.question"),
        ({"answer": "1"}, "instance.question"),
        ({"question": "  ", "answer": "1"}, "instance.question"),
        ({"question": "Q?"}, "instance.answer"),
        ({"question": "Q?", "answer": None}, "instance.answer"),
        ({"question": "Q?", "answer": True}, "instance.answer"),
        ({"question": "Q?", "answer": " "}, "instance.answer"),
        ({"question": "Q?", "answer": "x", "answer_type": "fuzzy"}, "instance.answer_type"),
        ({"question": "Q?", "answer": "carbon", "answer_type": "number"}, "instance.answer"),
        ({"question": "Q?", "answer": 3, "tolerance": -1}, "instance.tolerance"),
        ({"question": "Q?", "answer": 3, "tolerance": "5%"}, "instance.tolerance"),
        ({"question": "Q?", "answer": "x", "tolerance": 0.1}, "instance.tolerance"),
        ({**MMLU, "choices": "A, B"}, "instance.choices"),
        ({**MMLU, "choices": ["only one"]}, "instance.choices"),
        ({**MMLU, "choices": [str(i) for i in range(11)]}, "instance.choices"),
        ({**MMLU, "choices": ["a", "", "c"]}, "instance.choices[1]"),
        ({**MMLU, "choices": ["a", 2, "c"]}, "instance.choices[1]"),
        ({**MMLU, "answer": 4}, "instance.answer"),
        ({**MMLU, "answer": -1}, "instance.answer"),
        ({**MMLU, "answer": "E"}, "instance.answer"),
        ({**MMLU, "answer": "AB"}, "instance.answer"),
        ({**MMLU, "answer": "1"}, "instance.answer"),
        ({**MMLU, "answer": True}, "instance.answer"),
        ({k: v for k, v in MMLU.items() if k != "answer"}, "instance.answer"),
        ({**MMLU, "answer_type": "exact"}, "instance.answer_type"),
        ({**MMLU, "subject": 3}, "instance.subject"),
        ({**MMLU, "instructions": ""}, "instance.instructions"),
        ({**MMLU, "system_prompt": ["x"]}, "instance.system_prompt"),
        ({**GPQA, "question": "also lower-case"}, "instance"),
        ({k: v for k, v in GPQA.items() if k != "Correct Answer"}, 'instance["Correct Answer"]'),
        ({**GPQA, "Incorrect Answer 2": ""}, 'instance["Incorrect Answer 2"]'),
        ({k: v for k, v in GPQA.items() if k != "Question"}, 'instance["Question"]'),
        ({**GPQA, "shuffle_seed": "7"}, "instance.shuffle_seed"),
        ({**GPQA, "High-level domain": 1}, 'instance["High-level domain"]'),
        ({**GPQA, "tolerance": 0.1}, "instance.tolerance"),
    ],
)
def test_invalid_instances_name_the_field(instance, field):
    with pytest.raises(InvalidInstance) as info:
        StemHandler(ctx=None).validate(instance)
    assert info.value.field == field


# --- shapes and prompts ----------------------------------------------------------------
def test_mmlu_shape_prompt_and_gold():
    state = prepare(MMLU)
    assert state.shape == "mmlu" and state.subject == "geography"
    assert state.spec == {"kind": "choice", "choices": ["London", "Paris", "Rome", "Berlin"], "gold": "B"}
    assert state.question == (
        "Subject: geography\n\nWhat is the capital of France?\n\nA) London\nB) Paris\nC) Rome\nD) Berlin"
    )
    assert '"Answer: X"' in state.answer_format and "A, B, C, D" in state.answer_format
    assert prepare({**MMLU, "answer": "b"}).spec["gold"] == "B"  # a letter, any case
    ten = prepare({**MMLU, "choices": [f"c{i}" for i in range(10)], "answer": "J"})
    assert ten.spec["gold"] == "J" and "J) c9" in ten.question


def test_short_answer_kinds():
    assert prepare(NUMBER).spec == {"kind": "number", "gold": "3.00e8", "tolerance": 0.01}
    assert prepare({"question": "Q?", "answer": 46}).spec["kind"] == "number"
    assert prepare({"question": "Q?", "answer": "6371 km", "tolerance": 0.001}).spec["tolerance"] == 0.001
    assert prepare(EXACT).spec == {"kind": "exact", "gold": "Na"}
    # Not numbers, though they start with digits: exact.
    for gold in ("1,2-dichloroethane", "5th", "H2O"):
        assert prepare({"question": "Q?", "answer": gold}).spec["kind"] == "exact"
    expr = prepare({"question": "Q?", "answer": "\\frac{1}{2} m v^2", "answer_type": "expression"})
    assert expr.spec["kind"] == "expression" and "<value>" in expr.answer_format
    assert prepare({"question": "Q?", "answer": "42", "answer_type": "exact"}).spec["kind"] == "exact"
    state = prepare({**EXACT, "instructions": "Reply with the symbol only, as Answer: <symbol>."})
    assert state.answer_format == "Reply with the symbol only, as Answer: <symbol>."
    assert state.shape == "short" and "A)" not in state.question


def test_gpqa_shuffle_is_deterministic_and_tracks_the_correct_letter():
    state = prepare(GPQA)
    spec = state.spec
    assert state.shape == "gpqa" and state.subject == "Particle Physics"
    assert sorted(spec["choices"]) == sorted(["Photon", "Gluon", "W boson", "Graviton"])
    assert spec["choices"][ord(spec["gold"]) - ord("A")] == "Photon"
    assert prepare(dict(GPQA)) == state  # same instance, same order
    # The order depends on the question (or the seed), never on Python's RNG state.
    orders = {tuple(prepare({**GPQA, "Question": f"{GPQA['Question']} ({i})"}).spec["choices"]) for i in range(12)}
    assert len(orders) > 1
    golds = {prepare({**GPQA, "shuffle_seed": seed}).spec["gold"] for seed in range(12)}
    assert len(golds) > 1
    seeded = prepare({**GPQA, "shuffle_seed": 3})
    assert seeded.spec == prepare({**GPQA, "shuffle_seed": 3, "Question": "Another question?"}).spec
    assert gpqa_order("q", ["a", "b", "c", "d"]) == gpqa_order("q", ["a", "b", "c", "d"])
    for seed in range(12):
        s = prepare({**GPQA, "shuffle_seed": seed}).spec
        assert s["choices"]["ABCD".index(s["gold"])] == "Photon"


# --- extraction ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, letter",
    [
        ("Answer: C", "C"),
        ("Paris is in France, so the answer is (B).", "B"),
        ("The correct option is C.", "C"),
        ("The best choice would be D", "D"),
        ("\\boxed{C}", "C"),
        ("\\boxed{\\text{B}}", "B"),
        ("After all that: **C**", "C"),
        ("**Answer:** D", "D"),
        ("The correct answer is: **(C) Rome**", "C"),
        ("Reasoning about capitals...\nC) Rome", "C"),
        ("Reasoning about capitals...\n(B)", "B"),
        ("Reasoning about capitals...\nB", "B"),
        ("Answer: C) Rome", "C"),
        ("answer: c", "C"),
        ("the answer is (d)", "D"),
        ("Final answer:\nB", "B"),
        ("The answer is therefore B.", "B"),
        ("The answer is A because London is bigger.", "A"),
        ("Answer: Paris", "B"),  # the text of a choice
        ("\\boxed{Rome}", "C"),
        ("So it must be the capital.\nParis", "B"),
        ("answer is Paris (B)", "B"),
        # The last explicit answer wins.
        ("Answer: B\nOn second thought... Answer: D", "D"),
        ("\\boxed{A} hmm, no. The answer is (C).", "C"),
        ("The answer is (B), not A.", "B"),
        ("**B** looks tempting but the correct option is D.", "D"),
        ("Answer: A\nAnswer: I am not sure", "A"),  # "I" is no choice of four
        # No false positives: letters inside words, articles, pronouns, abbreviations.
        ("A ball is thrown upward.", None),
        ("A ball rolls.\nIt stops.", None),
        ("Answer: A ball falls faster", None),
        ("I think so.", None),
        ("The answer is a bit unclear.", None),
        ("The answer is not obvious, e.g. consider Berlin.", None),
        ("Option **A** is incorrect.", None),
        ("Answer: E", None),  # out of range for four choices
        ("Answers vary. Capitals are cities.", None),
        ("", None),
    ],
)
def test_choice_extraction(reply, letter):
    assert extract_answer(reply, CHOICE_SPEC) == letter


@pytest.mark.parametrize(
    "reply, value",
    [
        ("Answer: 3.0e8 m/s", "3.0e8 m/s"),
        ("The answer is 2.998 × 10^8 m/s.", "2.998 × 10^8 m/s"),
        ("\\boxed{3 \\times 10^{8}}", "3 \\times 10^{8}"),
        ("Answer: $3\\times10^8$", "3\\times10^8"),
        ("Answer: 1\nAnswer: 2", "2"),
        ("Answer: fast", None),  # a number is asked for
        ("It is 3e8.", None),  # no explicit answer
    ],
)
def test_number_extraction(reply, value):
    assert extract_answer(reply, {"kind": "number", "gold": "3e8", "tolerance": 0.01}) == value


def test_exact_and_expression_extraction():
    assert extract_answer("Thinking.\n**Answer:** Sodium chloride.", {"kind": "exact"}) == "Sodium chloride"
    assert extract_answer("no marker here", {"kind": "exact"}) is None
    assert extract_answer("Answer: \\frac{m v^2}{2}", {"kind": "expression"}) == "\\frac{m v^2}{2}"


@pytest.mark.parametrize(
    "text, value",
    [
        ("3.0e8", 3.0e8),
        ("3.0E+08", 3.0e8),
        ("3 x 10^8", 3e8),
        ("3×10^8", 3e8),
        ("3×10⁸ m/s", 3e8),
        ("3 \\times 10^{8}", 3e8),
        ("300,000,000", 3e8),
        ("9.8 m/s^2", 9.8),
        ("-4.5", -4.5),
        ("−4.5 J", -4.5),
        ("1.5 × 10⁻³", 1.5e-3),
        ("1/2", 0.5),
        ("\\frac{3}{4}", 0.75),
        ("10^8", 1e8),
        ("v = 3e8 m/s", 3e8),
        ("about 6371 km", 6371),
        ("H2O has 3 atoms", 3),
        ("25%", 25),
        ("no number", None),
        ("m/s^2", None),
    ],
)
def test_parse_number(text, value):
    parsed = parse_number(text)
    assert parsed == pytest.approx(value) if value is not None else parsed is None


def test_numeric_answers_and_tolerance():
    assert is_numeric_answer("300 K") and is_numeric_answer("3×10⁸ m/s") and is_numeric_answer("6.022e23")
    assert not is_numeric_answer("5th") and not is_numeric_answer("1,2-dichloroethane")
    assert numbers_match(2.998e8, 3e8) and numbers_match(3.029e8, 3e8)
    assert not numbers_match(3.04e8, 3e8) and not numbers_match(2.9e8, 3e8)
    assert numbers_match(3.04e8, 3e8, tolerance=0.05) and not numbers_match(1025, 1024, tolerance=0)
    assert numbers_match(0.005, 0) and not numbers_match(0.02, 0)  # absolute around 0
    spec = {"kind": "number", "gold": "3.00e8", "tolerance": 0.01}
    for answer in ("3.0e8", "3 x 10^8", "3×10^8", "300,000,000 m/s", "2.998 × 10⁸ m/s", "299792458"):
        assert score_stem_answer(answer, spec), answer
    for answer in ("3.1e8", "3e7", "30", "-3e8"):
        assert not score_stem_answer(answer, spec), answer
    assert score_stem_answer("9.8 m/s^2", {"kind": "number", "gold": "9.81", "tolerance": 0.01})


def test_exact_and_choice_scoring():
    assert normalize_text("  The Sodium-Chloride. ") == "sodium chloride"
    exact = {"kind": "exact", "gold": "sodium chloride"}
    assert score_stem_answer("Sodium Chloride", exact) and score_stem_answer("sodium-chloride!", exact)
    assert not score_stem_answer("NaCl", exact)
    assert score_stem_answer("\\text{Na}", {"kind": "exact", "gold": "Na"})
    assert score_stem_answer("b", CHOICE_SPEC) and not score_stem_answer("C", CHOICE_SPEC)
    expr = {"kind": "expression", "gold": "\\frac{1}{2} m v^2"}
    assert score_stem_answer("m v^2 / 2", expr) and not score_stem_answer("m v^2", expr)


# --- episodes --------------------------------------------------------------------------
async def episode(ctx, rollout) -> StemHandler:
    handler = StemHandler(ctx)
    await handler.init(rollout)
    await handler.run(rollout)
    return handler


async def test_env_asks_for_the_format_until_an_answer():
    state = prepare(MMLU)
    env = StemEnv(state.question, state.system_prompt, state.spec, state.answer_format)
    system, user = env.initial_messages()
    assert system["role"] == "system"
    assert user["content"].startswith("Subject: geography") and user["content"].endswith(state.answer_format)
    step = await env.step("Hmm, a capital city.")
    assert not step.done and "Answer: X" in step.messages[0]["content"]
    assert "A, B, C, D" in step.messages[0]["content"]
    step = await env.step("Answer: B")
    assert step.done and env.answer == Reading("B") and env.malformed_replies == 1


@pytest.mark.parametrize("reply, reward", [("Paris it is.\nAnswer: B", 1.0), ("Answer: C) Rome", 0.0)])
async def test_mmlu_episode_is_scored(ctx, new_rollout, scripted, reply, reward):
    rollout = new_rollout(MMLU, llm=scripted([reply]))
    handler = await episode(ctx, rollout)
    assert len(rollout.trajectory.turns) == 1 and rollout.trajectory.ended_by == "finished"
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == reward
    details = evaluation.details
    assert details["gold"] == "B" and details["gold_text"] == "Paris" and details["method"] == "choice"
    assert details["extracted"] == reply[-1] if reward else details["extracted"] == "C"
    assert details["extracted_text"] == ("Paris" if reward else "Rome")
    assert details["shape"] == "mmlu" and details["subject"] == "geography" and details["turns"] == 1
    await handler.cleanup(rollout)


async def test_gpqa_episode_tracks_the_shuffled_letter(ctx, new_rollout, scripted):
    spec = prepare(GPQA).spec
    wrong = next(letter for letter in "ABCD" if letter != spec["gold"])
    for letter, reward in ((spec["gold"], 1.0), (wrong, 0.0)):
        rollout = new_rollout(GPQA, llm=scripted([f"The answer is ({letter})."]))
        handler = await episode(ctx, rollout)
        evaluation = await handler.eval(rollout)
        assert evaluation.reward == reward
        assert evaluation.details["gold_text"] == "Photon" and evaluation.details["shape"] == "gpqa"


async def test_short_answer_episodes(ctx, new_rollout, scripted):
    cases = [
        (NUMBER, "c = 2.998 x 10^8 m/s\nAnswer: 2.998 x 10^8 m/s", 1.0, "number"),
        (NUMBER, "Answer: 3.2e8", 0.0, "number"),
        ({**NUMBER, "tolerance": 0.1}, "Answer: 3.2e8", 1.0, "number"),
        (EXACT, "Answer: **na**", 1.0, "exact"),
        (EXACT, "Answer: K", 0.0, "exact"),
        (
            {"question": "KE?", "answer": "\\frac{1}{2} m v^2", "answer_type": "expression"},
            "Answer: m v^2/2",
            1.0,
            "math-verify",
        ),
    ]
    for instance, reply, reward, method in cases:
        rollout = new_rollout(instance, llm=scripted([reply]))
        handler = await episode(ctx, rollout)
        evaluation = await handler.eval(rollout)
        assert (evaluation.reward, evaluation.details["method"]) == (reward, method), reply


async def test_malformed_reply_gets_a_retry_then_scores(ctx, new_rollout, scripted):
    llm = scripted(["I believe it is the second one.", "Sorry. Answer: B"])
    rollout = new_rollout(MMLU, llm=llm)
    handler = await episode(ctx, rollout)
    traj = rollout.trajectory
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert "Answer: X" in traj.messages[3]["content"]
    assert len(traj.turns) == 2 and traj.ended_by == "finished"
    first_prompt, second_prompt = llm.prompts  # append-only token history
    assert second_prompt[: len(first_prompt)] == first_prompt
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == 1.0 and evaluation.details["turns"] == 2


async def test_no_answer_within_max_turns_scores_zero_without_the_scorer(tokenizer, new_rollout, scripted):
    pool = ScoringPool(workers=1)
    pool.close()  # eval must not call it
    ctx = HandlerContext(tokenizer=tokenizer, scoring=pool)
    rollout = new_rollout(NUMBER, max_turns=2, llm=scripted(["very fast", "Answer: fast"]))
    handler = await episode(ctx, rollout)
    assert rollout.trajectory.ended_by == "max_turns"
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == 0.0 and evaluation.details["extracted"] is None


async def test_custom_instructions_and_system_prompt(ctx, new_rollout, scripted):
    instance = {**EXACT, "instructions": "Give the symbol as Answer: <symbol>.", "system_prompt": "Be brief."}
    rollout = new_rollout(instance, llm=scripted(["Answer: Na"]))
    handler = await episode(ctx, rollout)
    system, user = rollout.trajectory.messages[:2]
    assert system["content"] == "Be brief." and user["content"].endswith("Give the symbol as Answer: <symbol>.")
    assert (await handler.eval(rollout)).reward == 1.0


async def test_run_before_init_or_without_llm_is_infra(ctx, new_rollout, scripted):
    from rollserve.errors import InfraError

    with pytest.raises(InfraError):
        await StemHandler(ctx).run(new_rollout(MMLU))
    with pytest.raises(InfraError):
        await StemHandler(ctx).run(new_rollout(MMLU, llm=scripted(["Answer: B"])))


# --- the bundled set -------------------------------------------------------------------
TASKS = bundled_rows("stem")


def test_bundled_set_is_varied_and_valid():
    assert len(TASKS) >= 24 and len({t["task_id"] for t in TASKS}) == len(TASKS)
    shapes = [prepare(t).shape for t in TASKS]
    kinds = {prepare(t).spec["kind"] for t in TASKS}
    assert {"mmlu", "gpqa", "short"} <= set(shapes) and {"choice", "number", "exact"} <= kinds
    for task in TASKS:
        StemHandler(ctx=None).validate(task)


def _wrong(spec: dict) -> str:
    if spec["kind"] == "choice":
        return next(letter for letter in "ABCDEFGHIJ" if letter != spec["gold"])
    if spec["kind"] == "number":
        return str(parse_number(spec["gold"]) * 2 + 1)
    return "zzz"


@pytest.mark.parametrize("task", TASKS, ids=[t["task_id"] for t in TASKS])
async def test_bundled_task_gold_scores_one_and_a_wrong_answer_zero(ctx, new_rollout, scripted, task):
    spec = prepare(task).spec
    handler = StemHandler(ctx)
    for answer, reward in ((spec["gold"], 1.0), (_wrong(spec), 0.0)):
        rollout = new_rollout(task, llm=scripted([f"Let me think.\nAnswer: {answer}"]))
        await handler.init(rollout)
        await handler.run(rollout)
        evaluation = await handler.eval(rollout)
        assert evaluation.reward == reward, (task["task_id"], answer, evaluation.details)


# --- through the API ---------------------------------------------------------------------
def _letter_of_text(prompt: str, text: str) -> str:
    return re.search(rf"^([A-J])\) {re.escape(text)}$", prompt, re.MULTILINE).group(1)


async def test_whole_pipeline_through_the_api(make_api):
    def reply(prompt_ids: list[int], prompt: str) -> str:
        if "could not find a final answer" not in prompt:
            return "Let me think about which one it is."  # no answer: the handler asks again
        if "A) " in prompt:
            correct = "Photon" if "Photon" in prompt else "Paris"
            return f"Answer: {_letter_of_text(prompt, correct)}"
        return "Answer: 2.998 × 10^8 m/s"

    async with FakeVLLM("smollm2", replies=reply, latency=0.01) as server:
        _, client = await make_api([server.url])
        tasks = [{"data_source": "stem", "instance": instance, "n": 2} for instance in (MMLU, GPQA, NUMBER)]
        r = await client.post("/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 64}})
        assert r.status_code == 202, r.text
        # Results from the store's cursor (a group view may show a rollout done a moment
        # before its result is stored).
        results, cursor = [], 0
        while len(results) < 6:
            page = (await client.get("/v1/results", params={"after": cursor, "wait": 30})).json()
            assert page["results"], "no result within 30 s"
            results += page["results"]
            cursor = page["next"]
        assert len(results) == 6
        for result in results:
            assert result["status"] == "completed" and result["mask"] is False, result
            assert result["reward"] == 1.0, result
            tokens = result["trajectory"]["tokens"]
            assert len(tokens["input_ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"])
            assert len(result["trajectory"]["turns"]) == 2  # no answer, a format reminder, the answer

        bad = {"data_source": "stem", "instance": {**GPQA, "Incorrect Answer 3": ""}}
        r = await client.post("/v1/rollouts", json={"tasks": [bad]})
        assert r.status_code == 422
        assert r.json()["errors"][0]["field"] == 'tasks[0].instance["Incorrect Answer 3"]'


@pytest.mark.parametrize(
    "reply, letter, named",
    [
        # Hedges: the answer's clause names more than one choice.
        ("Answer: A or B", None, ("A", "B")),
        ("Answer: A, B, or C", None, ("A", "B", "C")),
        ("Answer: a or b", None, ("A", "B")),
        ("**A** or **B**", None, ("A", "B")),
        ("\\boxed{A or B}", None, ("A", "B")),
        ("Answer: \uff21 or \u0412", None, ("A", "B")),  # full-width A, Cyrillic Ve
        # Not hedges: the other letter is in an explanation, a formula, or an article.
        ("Answer: B, because A is wrong", "B", ()),
        ("**Answer: B** (A and C are incorrect)", "B", ()),
        ("Answer: B; A and C are wrong", "B", ()),
        ("Answer: A or B (both are plausible)", None, ("A", "B")),
        ("Answer: B (or A)", None, ("B", "A")),
        ("The answer is not A but **B**", "B", ()),
        ("Option A is wrong, so **B**", "B", ()),
        ("Answer: B. A ball falls.", "B", ()),
        ("Answer: B, the speed of light c", "B", ()),
        ("Answer: B (F = ma)", "B", ()),
        ("Answer: \u0412", "B", ()),  # a look-alike alone reads as its letter
        ("Answer: B\nOn second thought... Answer: D", "D", ()),  # the last answer wins
    ],
)
def test_choice_hedges_are_ambiguous(reply, letter, named):
    reading = read_answer(reply, CHOICE_SPEC)
    assert reading is not None
    assert (reading.answer, reading.named, reading.ambiguous) == (letter, named, bool(named))
    assert extract_answer(reply, CHOICE_SPEC) == letter


BOTH_SPEC = {"kind": "choice", "choices": ["Paris", "London", "Both A and B", "None of A-C"], "gold": "C"}


@pytest.mark.parametrize(
    "reply, letter, named",
    [
        # The chosen option's own words name no other choice...
        ("Answer: C) Both A and B", "C", ()),
        ("Answer: C (Both A and B)", "C", ()),
        ("Answer: C, both A and B", "C", ()),
        ("Answer: C\nBoth A and B", "C", ()),
        ("Answer: D, none of A-C", "D", ()),
        # ...while a hedge beside them still is one.
        ("Answer: C) Both A and B or D", None, ("C", "D")),
        ("Answer: C or D", None, ("C", "D")),
    ],
)
def test_an_option_whose_text_names_letters_is_read_as_itself(reply, letter, named):
    reading = read_answer(reply, BOTH_SPEC)
    assert reading is not None
    assert (reading.answer, reading.named) == (letter, named)

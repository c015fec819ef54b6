"""MathHandler end to end with a scripted LLM session: init -> run -> eval."""

from __future__ import annotations

import asyncio
import operator
import random
import time

import pytest
import reasoning_gym

from rollserve.errors import InfraError
from rollserve.handlers.base import AgentHandler, HandlerContext
from rollserve.handlers.latex import boxed_answers, extract_boxed, plain_integer_verdict, verify_math_answer
from rollserve.handlers.math.handler import MathEnv, MathHandler
from rollserve.handlers.math.prompts import RETRY_MESSAGE
from rollserve.handlers.scoring import ScoringPool, score_in_pool
from rollserve.handlers.single_answer import final_answer
from tests.waiting import eventually

QUESTION = {"question": "What is 7 + 5?", "answer": "12"}


async def episode(ctx, rollout) -> MathHandler:
    handler = MathHandler(ctx)
    await handler.init(rollout)
    await handler.run(rollout)
    return handler


def test_is_an_agent_handler():
    handler = MathHandler(ctx=None)
    assert isinstance(handler, AgentHandler)
    assert handler.name == "math"
    assert handler.defaults.max_turns == 3 and handler.defaults.max_context_tokens == 2048


# --- the environment -------------------------------------------------------------
async def test_env_asks_again_until_a_boxed_answer():
    env = MathEnv("What is 2 + 2?")
    system, user = env.initial_messages()
    assert system["role"] == "system" and "\\boxed{}" in system["content"]
    assert user["content"].startswith("What is 2 + 2?") and "\\boxed{}" in user["content"]

    step = await env.step("It is four.")
    assert not step.done
    assert step.messages == [{"role": "user", "content": RETRY_MESSAGE}]
    step = await env.step("\\boxed{}")  # an empty box is no answer either
    assert not step.done and env.malformed_replies == 2

    step = await env.step("2 + 2 = 4, so \\boxed{4}.")
    assert step.done and step.messages == []
    assert env.answer == "4"


def test_final_answer_takes_the_last_boxed_reply():
    messages = [
        {"role": "user", "content": "\\boxed{99}"},  # never the user's
        {"role": "assistant", "content": "\\boxed{1}"},
        {"role": "assistant", "content": "no box"},
    ]
    assert final_answer(messages, extract_boxed) == "1"
    assert final_answer(messages[:1], extract_boxed) is None


def test_every_distinct_boxed_answer_is_read_the_last_one_last():
    assert boxed_answers("\\boxed{3} or \\boxed{4}") == ["3", "4"]
    assert boxed_answers("\\boxed{3} \\boxed{4} \\boxed{ 3 }") == ["4", "3"]  # spaces ignored
    assert boxed_answers("\\boxed{} \\boxed {12}") == ["12"]
    assert boxed_answers("no box") == []
    text = "\\boxed{\\frac{1}{2}} so \\boxed{0.5}"
    assert boxed_answers(text)[-1] == extract_boxed(text) == "0.5"


# --- scoring -------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("12", "12", True),
        ("13", "12", False),
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("0.75", "\\frac{3}{4}", True),
        ("12.0", "12", True),
        ("x = 7", "7", True),
        ("7", "x=7", True),
        ("\\$12", "12", True),
        ("12 \\text{ dollars}", "12", True),
        ("\\sqrt{2}", "1.41421356", True),
        ("2^{10}", "1024", True),
        ("\\frac{2}{3}", "0.5", False),
        ("banana", "12", False),
    ],
)
def test_math_verify_equivalence(answer, gold, expected):
    # Called in-process here (main thread, so math-verify's SIGALRM works) for speed;
    # the handler runs the same function in the scoring pool.
    assert verify_math_answer(answer, gold) is expected


PLAIN_INTEGER_PAIRS = [
    ("12", "12"),
    ("13", "12"),
    ("012", "12"),
    ("12", "0012"),
    ("-0", "0"),
    ("-12", "12"),
    ("-12", "-12"),
    (" 12 ", "12"),
    ("0", "00"),
    ("999999", "1000000"),
    ("1000001", "1000000"),
    ("123456789012345678", "123456789012345678"),
    ("123456789012345678", "123456789012345679"),
    ("100000000000000001", "100000000000000000"),
]


@pytest.mark.parametrize("answer, gold", PLAIN_INTEGER_PAIRS)
def test_plain_integers_get_math_verifys_verdict_without_it(answer, gold):
    assert plain_integer_verdict(answer, gold) is verify_math_answer(answer, gold)


def test_random_plain_integers_get_math_verifys_verdict():
    rng = random.Random(25)
    for _ in range(60):
        gold = rng.randint(-(10 ** rng.randint(1, 18)) + 1, 10 ** rng.randint(1, 18) - 1)
        answer = gold + rng.choice([0, 0, 1, -1, 10, -(10 ** rng.randint(1, 17))])
        assert plain_integer_verdict(str(answer), str(gold)) is verify_math_answer(str(answer), str(gold))


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("12.0", "12"),
        ("1,000", "1000"),
        ("+12", "12"),
        ("x = 7", "7"),
        ("7", "x=7"),
        ("12", "\\frac{24}{2}"),
        ("\u0661\u0662", "12"),  # Arabic-Indic digits: not ASCII, math-verify's call
        ("1" * 19, "1" * 19),  # longer than the 18 digits held to math-verify above
        ("", "12"),
        ("-", "0"),
        ("1 2", "12"),
    ],
)
def test_anything_but_two_plain_integers_is_left_to_math_verify(answer, gold):
    assert plain_integer_verdict(answer, gold) is None


@pytest.mark.parametrize("reply, reward", [("\\boxed{12}", 1.0), ("\\boxed{012}", 1.0), ("\\boxed{13}", 0.0)])
async def test_an_integer_answer_is_scored_without_the_scoring_pool(tokenizer, new_rollout, scripted, reply, reward):
    pool = ScoringPool(workers=1)
    pool.close()  # a closed pool fails any task sent to it (test_scorer_crash_or_dead_pool...)
    handler = MathHandler(HandlerContext(tokenizer=tokenizer, scoring=pool))
    rollout = new_rollout(QUESTION, llm=scripted([reply]))
    await handler.init(rollout)
    await handler.run(rollout)
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == reward and evaluation.details["method"] == "integer"


@pytest.mark.parametrize(
    "reply, reward, method",
    [
        ("So the answer is \\boxed{12}.", 1.0, "integer"),
        ("\\boxed{\\frac{24}{2}}", 1.0, "math-verify"),
        ("\\boxed{13}", 0.0, "integer"),
        ("\\boxed{12} or \\boxed{\\frac{24}{2}}", 1.0, "math-verify"),  # not every answer an integer
    ],
)
async def test_first_turn_answer_is_scored(ctx, new_rollout, scripted, reply, reward, method):
    rollout = new_rollout(QUESTION, llm=scripted([reply]))
    handler = await episode(ctx, rollout)
    traj = rollout.trajectory
    assert len(traj.turns) == 1 and traj.ended_by == "finished"
    assert traj.turns[0].policy_version == 7
    assert rollout.timing["llm"] >= 0 and "tools" in rollout.timing
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == reward
    assert evaluation.details["method"] == method
    assert evaluation.details["gold"] == "12"
    assert evaluation.details["turns"] == 1
    assert evaluation.details["extracted"] == reply.rsplit("\\boxed{", 1)[1].rsplit("}", 1)[0]
    await handler.cleanup(rollout)


async def test_malformed_reply_gets_a_retry_then_scores(ctx, new_rollout, scripted):
    llm = scripted(["The answer is 12.", "Sorry: \\boxed{12}"])
    rollout = new_rollout(QUESTION, llm=llm)
    handler = await episode(ctx, rollout)
    traj = rollout.trajectory
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert traj.messages[3]["content"] == RETRY_MESSAGE
    assert len(traj.turns) == 2 and traj.ended_by == "finished"
    # Append-only: the second prompt extends the first prompt + the first reply's ids.
    first_prompt, second_prompt = llm.prompts
    assert second_prompt[: len(first_prompt)] == first_prompt
    assert second_prompt[len(first_prompt) :][: len(traj.turns[0].output_ids)] == traj.turns[0].output_ids
    assert traj.fidelity.template_checked and traj.fidelity.mismatches == 0
    assert sum(traj.loss_mask) == traj.output_tokens
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == 1.0
    assert evaluation.details["turns"] == 2


async def test_no_answer_within_max_turns_scores_zero(tokenizer, new_rollout, scripted):
    pool = ScoringPool(workers=1)
    pool.close()  # proves eval does not even call the scorer
    ctx = HandlerContext(tokenizer=tokenizer, scoring=pool)
    rollout = new_rollout(QUESTION, max_turns=3, llm=scripted(["twelve", "12", "it is 12"]))
    handler = await episode(ctx, rollout)
    assert len(rollout.trajectory.turns) == 3 and rollout.trajectory.ended_by == "max_turns"
    evaluation = await handler.eval(rollout)
    assert evaluation.reward == 0.0
    assert evaluation.details["extracted"] is None and evaluation.details["turns"] == 3


async def test_custom_system_prompt_is_used(ctx, new_rollout, scripted):
    rollout = new_rollout({**QUESTION, "system_prompt": "Answer tersely."}, llm=scripted(["\\boxed{12}"]))
    await episode(ctx, rollout)
    assert rollout.trajectory.messages[0] == {"role": "system", "content": "Answer tersely."}


async def test_run_without_llm_session_is_infra(ctx, new_rollout):
    rollout = new_rollout(QUESTION)
    handler = MathHandler(ctx)
    await handler.init(rollout)
    with pytest.raises(InfraError):
        await handler.run(rollout)


async def test_cancelled_run_keeps_the_sampled_tokens(ctx, new_rollout, scripted):
    llm = scripted(["no idea"], block_after=1)
    rollout = new_rollout(QUESTION, llm=llm)
    handler = MathHandler(ctx)
    await handler.init(rollout)
    task = asyncio.create_task(handler.run(rollout))
    await eventually(lambda: llm.blocked, what="the second LLM call, which never answers")
    assert len(rollout.trajectory.turns) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(rollout.trajectory.turns) == 1  # the first reply survived the cancel
    assert "llm" in rollout.timing


async def test_pathological_answer_times_out_without_stalling_the_loop(tokenizer, new_rollout, scripted, loop_gaps):
    async with ScoringPool(workers=1, default_timeout=1.0) as pool:
        ctx = HandlerContext(tokenizer=tokenizer, scoring=pool)
        rollout = new_rollout({"question": "What is 1?", "answer": "1"}, llm=scripted(["\\boxed{9^{9^{9^{9}}}}"]))
        handler = await episode(ctx, rollout)

        gaps = loop_gaps
        started = time.monotonic()
        evaluation = await handler.eval(rollout)
        elapsed = time.monotonic() - started
        assert evaluation.reward == 0.0
        assert evaluation.details["timeout"] is True
        assert evaluation.details["extracted"] == "9^{9^{9^{9}}}"
        assert elapsed < 8  # bounded: the 1 s scoring timeout, then the worker is replaced
        assert len(gaps) > 30 and max(gaps) < 0.75  # the loop ticked all along (not stalled 1 s)
        # ...and the pool still scores the next rollout.
        ok = new_rollout({"question": "What is 1?", "answer": "1"}, llm=scripted(["\\boxed{1}"]))
        await episode(ctx, ok)
        assert (await handler.eval(ok)).reward == 1.0


# --- reasoning-gym instances -------------------------------------------------------
RG = {"dataset": "basic_arithmetic", "seed": 42, "index": 3, "config": {"max_terms": 3, "max_digits": 2}}


async def test_reasoning_gym_generation_is_deterministic_by_seed(ctx, new_rollout):
    handler = MathHandler(ctx)
    a, b, other = new_rollout(RG), new_rollout(dict(RG)), new_rollout({**RG, "seed": 43})
    for rollout in (a, b, other):
        await handler.init(rollout)
    assert a.state.question == b.state.question
    assert a.state.gold == b.state.gold
    assert (a.state.question, a.state.gold) != (other.state.question, other.state.gold)
    # Exactly what reasoning-gym itself generates for that seed and index.
    expected = reasoning_gym.create_dataset("basic_arithmetic", seed=42, size=500, max_terms=3, max_digits=2)[3]
    assert a.state.question == expected["question"]
    assert a.state.gold == str(expected["answer"])


async def test_reasoning_gym_answer_scored_by_its_scorer(ctx, new_rollout, scripted):
    handler = MathHandler(ctx)
    probe = new_rollout(RG)
    await handler.init(probe)
    gold = probe.state.gold

    right = new_rollout(RG, llm=scripted([f"Working... \\boxed{{{gold}}}"]))
    wrong = new_rollout(RG, llm=scripted([f"\\boxed{{{int(gold) + 1}}}"]))
    for rollout in (right, wrong):
        await handler.init(rollout)
        await handler.run(rollout)
    good, bad = await handler.eval(right), await handler.eval(wrong)
    assert good.reward == 1.0 and bad.reward < 1.0
    assert good.details["method"] == "reasoning-gym:basic_arithmetic"
    assert good.details["gold"] == gold and good.details["extracted"] == gold


async def test_reasoning_gym_list_config_and_text_wrapped_answer(ctx, new_rollout, scripted):
    instance = {"dataset": "basic_arithmetic", "seed": 1, "config": {"operators": ["+"], "max_terms": 2}}
    handler = MathHandler(ctx)
    probe = new_rollout(instance)
    await handler.init(probe)
    assert "+" in probe.state.question
    rollout = new_rollout(instance, llm=scripted([f"\\boxed{{\\text{{{probe.state.gold}}}}}"]))
    await handler.init(rollout)
    await handler.run(rollout)
    assert (await handler.eval(rollout)).reward == 1.0


async def test_scorer_crash_or_dead_pool_is_infra_not_a_zero(tokenizer, ctx, new_rollout, scripted):
    with pytest.raises(InfraError, match="ZeroDivisionError"):
        await score_in_pool(ctx.scoring, operator.truediv, 1, 0, what="a scorer")
    pool = ScoringPool(workers=1)
    pool.close()
    handler = MathHandler(HandlerContext(tokenizer=tokenizer, scoring=pool))
    # (Not a plain integer: math-verify in the pool decides it.)
    rollout = new_rollout(QUESTION, llm=scripted(["\\boxed{\\frac{24}{2}}"]))
    await handler.init(rollout)
    await handler.run(rollout)
    with pytest.raises(InfraError):
        await handler.eval(rollout)


def test_boxes_in_a_reasoning_models_thinking_are_not_its_answers():
    """A guess boxed while thinking is not a second final answer (it made a right
    answer after the thinking ambiguous, scored 0); a hedge after it still is one."""
    thought = "<think>so maybe \\boxed{3}? no, 3 + 1 = 4</think>"
    assert boxed_answers(f"{thought} The answer is \\boxed{{4}}.") == ["4"]
    assert boxed_answers(f"{thought} \\boxed{{3}} or \\boxed{{4}}") == ["3", "4"]
    assert boxed_answers(thought) == []

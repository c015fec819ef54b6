"""Which results the engine builds on the event loop (``pipeline.small_result``): only
small ones; a long episode's result (megabytes of ids to validate) goes to a thread."""

from __future__ import annotations

from rollserve.engine import pipeline
from rollserve.engine.rollout import Rollout, RolloutSpec


def _rollout() -> Rollout:
    spec = RolloutSpec(
        id="g-0",
        group_id="g",
        task_id="t",
        data_source="math",
        sample_index=0,
        instance={"question": "1+1", "answer": "2"},
    )
    r = Rollout(spec=spec)
    r.trajectory.add_prompt(list(range(100)))
    r.trajectory.messages = [{"role": "user", "content": "What is 1 + 1?"}]
    return r


def test_a_math_sized_result_is_built_on_the_loop():
    assert pipeline.small_result(_rollout())


def test_a_large_result_is_built_on_a_thread():
    many_ids = _rollout()
    many_ids.trajectory.add_prompt([1] * pipeline.INLINE_RESULT_TOKENS)
    assert not pipeline.small_result(many_ids)
    long_text = _rollout()  # (text the ids do not show: a harness's own messages)
    long_text.trajectory.messages = [{"role": "user", "content": "x" * (pipeline.INLINE_RESULT_CHARS + 1)}]
    assert not pipeline.small_result(long_text)
    many_messages = _rollout()
    many_messages.trajectory.messages = [{"role": "user", "content": "hi"}] * (pipeline.INLINE_RESULT_MESSAGES + 1)
    assert not pipeline.small_result(many_messages)
    parts = _rollout()  # content that is not text is not sized: a thread
    parts.trajectory.messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert not pipeline.small_result(parts)

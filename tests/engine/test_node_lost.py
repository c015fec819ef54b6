"""A stage that ends with ``NodeLost`` (a cluster node died under it): the rollout runs
again from INIT as its next attempt while attempts remain, else it ends failed and
masked, naming the node; one result either way."""

from tests.engine.test_pipeline import _results, _submit


async def test_a_lost_node_means_a_new_attempt_from_init(make_engine, handler):
    engine = await make_engine(max_attempts=3)
    (rid,) = await _submit(engine, {"node_dies": "run", "times": 2, "reward": 0.5})
    (result,) = await _results(engine, [rid])
    assert result.status == "completed" and result.reward == 0.5 and not result.mask
    assert result.attempt == 3 and result.seq == 1
    assert handler.started["init"] == [rid] * 3 and handler.started["eval"] == [rid]
    assert handler.cleaned == [rid] * 3  # each attempt's cleanup, the last one's too


async def test_past_the_attempt_limit_it_ends_masked_naming_the_node(make_engine, handler):
    engine = await make_engine(max_attempts=2)
    (rid,) = await _submit(engine, {"node_dies": "eval", "times": 9})
    (result,) = await _results(engine, [rid])
    assert result.status == "failed" and result.mask and result.reward is None
    assert result.failure.stage == "eval" and result.failure.kind == "infra"
    assert result.failure.message == "node n1 died during eval; gave up after 2 attempts"
    assert result.attempt == 2 and handler.started["eval"] == [rid] * 2
    assert engine.status().finished == {"failed": 1}

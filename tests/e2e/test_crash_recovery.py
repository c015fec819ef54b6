"""SIGKILL the server mid-batch, restart it on the same store: nothing lost or doubled."""

import pytest

from rollserve.client import Client
from tests.waiting import wait_until

TASKS = [
    {"data_source": "math", "n": 4, "instance": {"question": f"What is {a} + {a}?", "answer": str(2 * a)}}
    for a in range(1, 5)
]


@pytest.mark.parametrize("policy", ["requeue", "interrupt"])
def test_sigkill_mid_batch_then_restart(server_factory, fake_llm_thread, tmp_path, policy):
    fake = fake_llm_thread(replies=["Let me think.", "The answer is \\boxed{2}."], latency=0.15)
    state = tmp_path / "state"
    first = server_factory("--backend", fake.url, "--run-workers", "4", "--on-restart", policy, state_dir=state).start()
    with Client(first.url) as client:
        ids = [rid for g in client.submit(TASKS).groups for rid in g.rollout_ids]

        def four_results() -> list | None:
            found = client.results(after=0, limit=100).results
            return found if len(found) >= 4 else None

        before = wait_until(four_results, 60, "4 results before the kill")
        first.kill()
    seen = {r.id: r for r in before}
    assert len(seen) < len(ids), "the kill came too late to test recovery"
    second = server_factory("--backend", fake.url, "--on-restart", policy, state_dir=state)
    with Client(second.start().url) as client:
        # A trainer that crashed after reading 2 results resumes from its cursor.
        head = client.results(after=0, limit=2).results
        rest = list(client.stream_results(after=head[-1].seq or 0, until=len(ids) - 2, wait=10))
        status = client.status()
    results = head + rest
    assert [r.seq for r in results] == list(range(1, len(ids) + 1))  # no gaps
    assert sorted(r.id for r in results) == sorted(ids)  # none lost, none twice
    recovered = 0
    for r in results:
        if r.id in seen:  # what the trainer saw before the crash is unchanged
            assert r == seen[r.id]
        elif r.attempt == 1 and r.status == "completed":
            pass  # finished between the last read and the kill
        elif policy == "requeue":
            assert r.status == "completed" and r.attempt == 2 and r.mask is False
            recovered += 1
        else:
            assert r.status == "interrupted" and r.mask is True
            assert r.failure.kind == "infra" and "server stopped" in r.failure.message
            recovered += 1
    assert recovered > 0
    counted = status.recovered_at_start
    assert (counted.requeued if policy == "requeue" else counted.interrupted) == recovered

"""A trainer's view: submit over HTTP, stream results, train on exact tokens."""

import json

import httpx

from rollserve.client import Client
from tests.e2e.conftest import check_completed_as_sampled

TASKS = [
    {"data_source": "math", "n": 4, "instance": {"question": "What is 2 + 2?", "answer": "4"}},
    {"data_source": "math", "n": 4, "instance": {"question": "What is 3 + 5?", "answer": "8"}},
]


def test_two_tasks_times_four_samples(server_factory, fake_llm_thread):
    # First reply has no boxed answer, so each episode takes two turns.
    fake = fake_llm_thread(replies=["I think it is four.", "So the answer is \\boxed{4}."], latency=0.02)
    server = server_factory("--backend", fake.url).start()
    with Client(server.url) as client:
        accepted = client.submit(TASKS, sampling={"max_tokens": 64, "temperature": 1.0}, agent={"max_turns": 3})
        assert [len(g.rollout_ids) for g in accepted.groups] == [4, 4]
        results = list(client.stream_results(after=0, until=8, wait=10))
    assert len(results) == 8
    assert [r.seq for r in results] == list(range(1, 9))
    assert len({r.id for r in results}) == 8
    check_completed_as_sampled(results, fake)
    groups = {r.group_id for r in results}
    assert groups == {g.group_id for g in accepted.groups}


def test_server_sent_events_report_state_changes(server_factory, fake_llm_thread):
    fake = fake_llm_thread(replies=["\\boxed{4}"], latency=0.05)
    server = server_factory("--backend", fake.url).start()
    seen = []
    with httpx.stream("GET", f"{server.url}/v1/events", timeout=30) as events:
        with Client(server.url) as client:
            rid = client.submit(TASKS[:1]).groups[0].rollout_ids[0]
        for line in events.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("rollout_id") == rid:
                    seen.append(event["status"])
                    if event["status"] == "completed":
                        break
    assert seen == ["queued", "init", "run", "eval", "completed"]

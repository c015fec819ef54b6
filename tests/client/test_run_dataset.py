"""``rollserve run``'s engine: a dataset through a live server (the test-double LLM
answers \\boxed{4}), results to JSONL, resumable and idempotent."""

from __future__ import annotations

import json

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.client import AsyncClient
from rollserve.client import run_dataset as run_module
from rollserve.client.run_dataset import DatasetRun, RunAborted, RunOptions, plan
from rollserve.contract import RolloutResult
from rollserve.datasets import read_dataset

QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 + 1?", "4"), ("What is 2 + 3?", "5")]
OPTIONS = RunOptions(sampling={"max_tokens": 32}, poll_wait=1.0)


def client_for(service) -> AsyncClient:
    app = create_app(service, manage_lifecycle=False)
    return AsyncClient("http://rollserve", transport=httpx.ASGITransport(app=app))


def dataset(tmp_path, rows=None):
    path = tmp_path / "mathset.jsonl"
    rows = rows or [
        {"data_source": "math", "instance": {"question": q, "answer": a}, "n": 2, "task_id": f"q{i}"}
        for i, (q, a) in enumerate(QUESTIONS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_dataset(path)


def results(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def run(service, items, output, options=OPTIONS, **kwargs):
    async with client_for(service) as client:
        return await DatasetRun(client, items, output, options, **kwargs).run()


async def test_runs_every_row_and_writes_each_result(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url])
    items = plan(dataset(tmp_path), "mathset", OPTIONS)
    seen = []
    report = await run(service, items, tmp_path / "out.jsonl", on_change=lambda p: seen.append(p.finished))
    written = results(tmp_path / "out.jsonl")
    assert len(written) == 6 and "seq" not in written[0]
    assert all(RolloutResult.model_validate(r).status == "completed" for r in written)
    assert {(r["task_id"], r["sample_index"]) for r in written} == {(item.id, i) for item in items for i in range(2)}
    assert all(r["task_id"].startswith("mathset/") for r in written)
    assert {r["metadata"]["task_id"] for r in written} == {"q0", "q1", "q2"}
    assert report.progress.finished == 6 and report.progress.submitted == 6
    assert report.progress.mean_reward == pytest.approx(4 / 6)
    assert seen[-1] == 6
    (math_,) = report.evaluation().sources
    assert (math_.data_source, math_.tasks, math_.samples, math_.scored, math_.masked) == ("math", 3, 6, 6, 0)
    assert math_.statuses == {"completed": 6} and math_.failures == {}
    assert math_.mean_reward == pytest.approx(4 / 6)
    assert report.rejected_by_data_source() == {}


async def test_a_rerun_reuses_the_servers_groups(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url])
    items = plan(dataset(tmp_path), "mathset", OPTIONS)
    await run(service, items, tmp_path / "first.jsonl")
    calls = len(fake_llm.calls)
    again = plan(dataset(tmp_path), "mathset", OPTIONS)  # same file, rows and settings
    report = await run(service, again, tmp_path / "second.jsonl")
    assert report.progress.reused_groups == 3 and report.progress.finished == 6
    assert len(fake_llm.calls) == calls  # nothing ran twice
    assert (await service.store.counts()) == {"completed": 6}
    assert sorted(map(json.dumps, results(tmp_path / "first.jsonl"))) == sorted(
        map(json.dumps, results(tmp_path / "second.jsonl"))
    )
    # Other settings are another evaluation: new ids, new rollouts.
    hotter = RunOptions(sampling={"max_tokens": 32, "temperature": 0.5}, poll_wait=1.0)
    report = await run(service, plan(dataset(tmp_path), "mathset", hotter), tmp_path / "third.jsonl")
    assert report.progress.reused_groups == 0 and len(fake_llm.calls) == calls + 6


async def test_resume_skips_rows_already_in_the_output(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url])
    items = plan(dataset(tmp_path), "mathset", OPTIONS)
    output = tmp_path / "out.jsonl"
    await run(service, items, output)
    lines = output.read_text().splitlines()
    by_task = {}
    for line in lines:
        by_task.setdefault(json.loads(line)["task_id"], []).append(line)
    done, half, _ = (by_task[item.id] for item in items)
    # A crash: one row complete, one with one sample, the last line cut short.
    output.write_text(
        "\n".join(
            [
                *done,
                half[0],
                '{"id": "g-trunc',
            ]
        )
    )
    report = await run(service, plan(dataset(tmp_path), "mathset", OPTIONS), output, resume=True)
    assert report.progress.skipped_rows == 1 and report.progress.total == 3
    assert report.progress.finished == 3 and report.progress.reused_groups == 2
    written = results(output)
    assert len(written) == 6
    assert len({(r["task_id"], r["sample_index"]) for r in written}) == 6
    assert len(report.outcomes) == 6  # the summary covers the whole file
    # Everything there: nothing to do, the file untouched.
    before = output.read_text()
    report = await run(service, plan(dataset(tmp_path), "mathset", OPTIONS), output, resume=True)
    assert report.progress.skipped_rows == 3 and report.progress.submitted == 0
    assert output.read_text() == before


async def test_rows_the_server_refuses_are_reported_and_the_rest_run(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url])
    rows = dataset(
        tmp_path,
        [
            {"data_source": "math", "instance": {"question": "1+3?", "answer": "4"}},
            {"data_source": "math", "instance": {"answer": "4"}},
            {"data_source": "math", "instance": {"question": "2+2?", "answer": "4"}},
        ],
    )
    report = await run(service, plan(rows, "mathset", OPTIONS), tmp_path / "out.jsonl")
    (rejected,) = report.rejected
    assert rejected.number == 2 and "tasks[1].instance.question: required" in rejected.error
    assert report.progress.finished == 2 and len(results(tmp_path / "out.jsonl")) == 2
    assert report.rejected_by_data_source() == {"math": 1}


async def test_in_flight_rollouts_stay_under_the_cap(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url])
    rows = dataset(
        tmp_path,
        [{"data_source": "math", "instance": {"question": f"{i}+0?", "answer": str(i)}, "n": 2} for i in range(6)],
    )
    options = RunOptions(sampling={"max_tokens": 32}, batch_size=4, max_in_flight=4, poll_wait=1.0)
    async with client_for(service) as client:
        sizes = []
        submit = client.submit

        async def counting_submit(tasks, **kwargs):
            sizes.append(sum(t["n"] for t in tasks))
            return await submit(tasks, **kwargs)

        client.submit = counting_submit
        job = DatasetRun(client, plan(rows, "capped", options), tmp_path / "out.jsonl", options)
        peaks = []
        job.on_change = lambda progress: peaks.append(job._in_flight)
        report = await job.run()
    assert report.progress.finished == 12
    assert max(peaks) <= 4 and max(sizes) <= 4 and sum(sizes) == 12


async def test_an_unreachable_server_aborts_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "TRANSPORT_RETRIES", 1)
    items = plan(dataset(tmp_path), "mathset", OPTIONS)
    async with AsyncClient("http://127.0.0.1:9") as client:  # the discard port: refused
        with pytest.raises(RunAborted, match="cannot reach the server"):
            await DatasetRun(client, items, tmp_path / "out.jsonl", OPTIONS).run()


def test_rows_with_the_same_own_id_are_refused(tmp_path):
    rows = dataset(tmp_path, [{"data_source": "math", "instance": {"question": "q", "answer": "1"}, "id": "same"}] * 2)
    with pytest.raises(ValueError, match="rows 1 and 2 have the same id 'same'"):
        plan(rows, "mathset", OPTIONS)


async def test_the_servers_max_pending_caps_the_run(make_api, fake_llm, tmp_path):
    service, _ = await make_api([fake_llm.url], max_pending=3)
    rows = dataset(
        tmp_path,
        [{"data_source": "math", "instance": {"question": f"{i}+0?", "answer": str(i)}, "n": 2} for i in range(4)]
        + [{"data_source": "math", "instance": {"question": "q", "answer": "1"}, "n": 4}],
    )
    report = await run(service, plan(rows, "capped", OPTIONS), tmp_path / "out.jsonl")
    assert report.progress.finished == 8
    (too_big,) = report.rejected
    assert too_big.number == 5 and "max_pending 3" in too_big.error

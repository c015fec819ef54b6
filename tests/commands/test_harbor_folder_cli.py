"""A folder of Harbor tasks as a dataset: ``rollserve datasets validate DIR``,
``rollserve images pull DIR`` and ``rollserve run DIR`` (embedded server, its harbor
root set to DIR) on a few bundled tasks copied aside under new names, ``run`` with a
policy that only finishes (the empty agent: reward 0)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rollserve
from rollserve.agent.tool_calls import format_tool_call
from rollserve.cli import app
from rollserve.datasets import DatasetError, read_dataset
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.sandbox.image_fakes import FAKE_APPTAINER, install

HARBOR = Path(rollserve.__file__).parent / "data" / "harbor"
BUNDLED_TASKS = ("csv-region-revenue", "json-team-rollup", "sort-inbox-files")
TASKS = tuple(f"mine-{name}" for name in BUNDLED_TASKS)  # names the bundled root does not hold
runner = CliRunner()
needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


@pytest.fixture
def tasks(tmp_path) -> Path:
    folder = tmp_path / "my-tasks"
    for name, mine in zip(BUNDLED_TASKS, TASKS, strict=True):
        shutil.copytree(HARBOR / name, folder / mine)
    (folder / ".cache").mkdir()  # hidden: not a task, not a row
    return folder


def test_a_folder_reads_as_one_row_per_task(tasks):
    rows = read_dataset(tasks)
    assert [r.task for r in rows] == [
        {"data_source": "harbor", "instance": {"task": name}, "metadata": {"task_id": name}} for name in TASKS
    ]
    assert [r.label for r in rows] == list(TASKS)
    (one,) = read_dataset(tasks / TASKS[0])  # a task folder: itself, named in its parent
    assert one.instance == {"task": TASKS[0]}
    with pytest.raises(DatasetError, match="leave out the data source"):
        read_dataset(tasks, data_source="math")


def test_a_folder_without_a_task_is_a_clear_error(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(DatasetError, match="no Harbor task"):
        read_dataset(tmp_path)
    result = cli("datasets", "validate", str(tmp_path))
    assert result.exit_code == 2 and "no Harbor task here" in result.output
    result = cli("run", str(tmp_path), "--backend", "http://127.0.0.1:9")
    assert result.exit_code == 2 and "no Harbor task here" in result.output


def test_validate_checks_each_task_in_the_folder(tasks):
    (tasks / TASKS[1] / "tests" / "test.sh").unlink()
    (tasks / "stray").mkdir()  # a visible folder without task.toml: a row, named invalid
    result = cli("datasets", "validate", str(tasks), "--json")
    assert result.exit_code == 1, result.output
    report = {r["task_id"]: r for r in json.loads(result.output)["rows"]}
    assert set(report) == {*TASKS, "stray"}
    assert report[TASKS[0]]["ok"] and report[TASKS[2]]["ok"]
    assert "test.sh" in report[TASKS[1]]["error"]
    assert report["stray"]["error"].startswith("instance.task")
    # The options' own root wins: the bundled tasks hold none of these names.
    result = cli(
        "datasets", "validate", str(tasks), "--json", "--handler-options", json.dumps({"harbor": {"root": str(HARBOR)}})
    )
    rows = json.loads(result.output)["rows"]
    assert result.exit_code == 1 and len(rows) == 4
    assert all("no such task under the server's harbor root" in r["error"] for r in rows)


@needs_bwrap
def test_run_a_folder_end_to_end_with_an_agent_that_only_finishes(tasks, tmp_path):
    output = tmp_path / "out.jsonl"
    with FakeVLLM("smollm2", replies=[format_tool_call("finish", {})], latency=0.01) as llm:
        result = cli(
            "run",
            str(tasks),
            "--backend",
            llm.url,
            "-o",
            str(output),
            "--max-tokens",
            "64",
            "--state-dir",
            str(tmp_path / "state"),
        )
        assert result.exit_code == 0, result.output
        assert len(llm.calls) >= len(TASKS)  # each rollout asked the policy, which finished
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["metadata"]["task_id"] for r in written) == sorted(TASKS)
    for r in written:
        assert r["status"] == "completed" and not r["mask"], r
        assert r["reward"] == 0.0 and r["task_id"].startswith("my-tasks/"), r
        assert r["evaluation"]["finished"] is True, r
    assert "│ harbor" in result.output


def test_images_pull_fetches_the_folder_tasks_images(tasks, tmp_path, monkeypatch):
    fake = install(tmp_path, monkeypatch, "apptainer", FAKE_APPTAINER)
    toml = tasks / TASKS[0] / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "python:3.12-slim"\n'))
    cache = tmp_path / "sif"
    result = runner.invoke(
        app,
        ["images", "pull", str(tasks), "--image-cache", str(cache)],
        env={"COLUMNS": "250", "PATH": os.environ["PATH"]},
    )
    assert result.exit_code == 0, result.output
    assert [c["argv"][2] for c in fake.calls("build")] == ["docker://python:3.12-slim"]

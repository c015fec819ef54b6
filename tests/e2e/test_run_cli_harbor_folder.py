"""``rollserve run DIR --server URL`` on a folder of Harbor tasks: the rows name each
task by its folder's name, checked here against DIR, run in the server's harbor root."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rollserve
from rollserve.agent.tool_calls import format_tool_call
from rollserve.cli import app
from rollserve.sandbox.bubblewrap import BubblewrapRuntime

HARBOR = Path(rollserve.__file__).parent / "data" / "harbor"
TASKS = {"mine-csv": "csv-region-revenue", "mine-json": "json-team-rollup"}
runner = CliRunner()
pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def test_run_a_folder_against_a_server_whose_root_holds_it(server_factory, fake_llm_thread, tmp_path):
    tasks = tmp_path / "my-tasks"
    for mine, bundled in TASKS.items():
        shutil.copytree(HARBOR / bundled, tasks / mine)
    llm = fake_llm_thread(replies=[format_tool_call("finish", {})])
    server = server_factory(
        "--backend", llm.url, "--handler-options", json.dumps({"harbor": {"root": str(tasks)}})
    ).start()
    output = tmp_path / "out.jsonl"

    def run(folder: Path):
        return runner.invoke(
            app,
            ["run", str(folder), "--server", server.url, "-o", str(output), "--max-tokens", "64"],
            env={"COLUMNS": "250"},
        )

    result = run(tasks)
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["metadata"]["task_id"] for r in written) == sorted(TASKS)
    assert all(r["status"] == "completed" and r["reward"] == 0.0 for r in written), written
    # A folder the server's root does not hold: valid here, refused there by name.
    calls = len(llm.calls)
    other = tmp_path / "other-tasks"
    shutil.copytree(HARBOR / "csv-region-revenue", other / "not-on-the-server")
    result = run(other)
    assert result.exit_code == 1, result.output
    assert "row 1 rejected" in result.output and "not-on-the-server" in result.output
    assert len(llm.calls) == calls

"""``rollserve run -d swe``: each result names its instance (``metadata.instance_id``),
not only the row's id, with a server started in the command and real sandboxes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rollserve.agent.tool_calls import format_tool_call
from rollserve.cli import app
from rollserve.datasets import SWE_MINI
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def test_results_carry_the_instance_id(tmp_path):
    rows = SWE_MINI.rows()[:2]
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "out.jsonl"
    llm = FakeVLLM(
        "smollm2", replies=["Nothing to do.\n" + format_tool_call("finish", {})], latency=0.0
    ).start_in_thread()
    try:
        result = CliRunner().invoke(
            app,
            [
                "run",
                str(path),
                "-d",
                "swe",
                "--backend",
                llm.url,
                "-o",
                str(output),
                "--max-tokens",
                "64",
                "--state-dir",
                str(tmp_path / "state"),
            ],
            env={"COLUMNS": "250"},
        )
    finally:
        llm.stop()
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["metadata"]["instance_id"] for r in written) == sorted(row["instance_id"] for row in rows)
    for r in written:  # each is the rollout of the instance it names
        assert r["evaluation"]["instance_id"] == r["metadata"]["instance_id"]
        assert r["task_id"].startswith("swe/")

"""``rollserve run`` with an embedded server (started in the command) on the
test-double LLM; the --server mode is in tests/e2e/test_run_cli_server.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rollserve.cli import app
from rollserve.testing import FakeVLLM

runner = CliRunner()
ROWS = [
    {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "n": 2},
    {"data_source": "math", "instance": {"question": "What is 2 + 3?", "answer": "5"}, "n": 2},
]


@pytest.fixture(scope="module")
def llm():
    server = FakeVLLM("smollm2", replies=["Adding them: \\boxed{4}"], latency=0.01).start_in_thread()
    yield server
    server.stop()


def dataset(tmp_path, rows=ROWS):
    path = tmp_path / "evalset.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(*args):
    return runner.invoke(app, ["run", *args], env={"COLUMNS": "250"})


def test_embedded_run_writes_results_and_a_summary(llm, tmp_path):
    output = tmp_path / "out.jsonl"
    args = [
        dataset(tmp_path),
        "--backend",
        llm.url,
        "-o",
        str(output),
        "--max-tokens",
        "32",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    result = run(*args)
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(written) == 4 and {r["status"] for r in written} == {"completed"}
    assert sorted(r["reward"] for r in written) == [0.0, 0.0, 1.0, 1.0]
    assert all(r["task_id"].startswith("evalset/") for r in written)
    summary = next(line for line in result.output.splitlines() if "│ math" in line)
    # data_source, tasks, rollouts, masked, failed, mean reward [95% CI], pass@1, pass@2,
    # maj@n: every sample answers 4, right for 2 + 2 and wrong for 2 + 3.
    cells = [c.strip() for c in summary.split("│")[1:-1]]
    assert cells[:5] == ["math", "2", "4", "0", "0"] and cells[5].startswith("0.500 [")
    assert cells[6:] == ["0.500", "0.500", "0.500"]
    report = json.loads(output.with_suffix(".report.json").read_text())
    assert report["sources"][0]["pass_at_k"] == {"1": 0.5, "2": 0.5}
    assert f"wrote 4 results to {output}" in result.output
    # The same state dir: the embedded server's store has them; nothing runs again.
    calls = len(llm.calls)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "2 tasks were already on the server" in result.output and len(llm.calls) == calls
    # A new run name: the same rows run again (e.g. for a new checkpoint).
    result = run(*args, "--run-name", "checkpoint-2")
    assert result.exit_code == 0, result.output
    assert "already on the server" not in result.output and len(llm.calls) == calls + 4
    assert all(json.loads(line)["task_id"].startswith("checkpoint-2/") for line in output.read_text().splitlines())


def test_invalid_rows_refuse_to_start_unless_skipped(llm, tmp_path):
    rows = [*ROWS, {"data_source": "math", "instance": {"answer": "1"}}]
    output = tmp_path / "out.jsonl"
    result = run(dataset(tmp_path, rows), "--backend", llm.url, "-o", str(output))
    assert result.exit_code == 2
    assert "1 invalid rows (rows 3)" in result.output and "--skip-invalid" in result.output
    assert "instance.question: required" in result.output
    assert not output.exists()
    result = run(
        dataset(tmp_path, rows),
        "--backend",
        llm.url,
        "-o",
        str(output),
        "--skip-invalid",
        "--n",
        "1",
        "--max-tokens",
        "32",
    )
    assert result.exit_code == 0, result.output
    assert "skipping 1 invalid rows" in result.output
    assert len(output.read_text().splitlines()) == 2  # n=1 for each valid row


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--server"),
        (["--server", "http://x:1", "--backend", "embedded"], "--backend"),
        (["--backend", "nonsense"], "--backend"),
        (["--backend", "embedded", "--sampling", '{"temprature": 1}'], "temprature"),
        (["--backend", "embedded", "--sandbox-runtime", "chroot"], "--sandbox-runtime"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, message):
    result = run(dataset(tmp_path), *args)
    assert result.exit_code == 2 and message in result.output


def test_an_unreachable_server_exits_2(tmp_path):
    result = run(dataset(tmp_path), "--server", "http://127.0.0.1:9")
    assert result.exit_code == 2 and "cannot use the server at http://127.0.0.1:9" in result.output

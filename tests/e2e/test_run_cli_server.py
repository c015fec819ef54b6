"""``rollserve run --server URL`` against a `rollserve serve` process: results to
JSONL, reruns that reuse the server's work, --resume, the bearer token."""

from __future__ import annotations

import json

import httpx
from typer.testing import CliRunner

from rollserve.cli import app

runner = CliRunner()
ROWS = [
    {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "n": 2},
    {"data_source": "math", "instance": {"question": "What is 2 + 3?", "answer": "5"}, "n": 2},
]


def test_run_against_a_server(server_factory, fake_llm_thread, tmp_path):
    llm = fake_llm_thread(replies=["Adding them: \\boxed{4}"])
    server = server_factory("--backend", llm.url, "--api-token", "tok").start()
    data = tmp_path / "evalset.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    output = tmp_path / "out.jsonl"

    def run(*args, token="tok"):
        return runner.invoke(
            app,
            [
                "run",
                str(data),
                "--server",
                server.url,
                "--api-token",
                token,
                "-o",
                str(output),
                "--max-tokens",
                "32",
                *args,
            ],
            env={"COLUMNS": "250"},
        )

    result = run()
    assert result.exit_code == 0, result.output
    first = output.read_text().splitlines()
    assert len(first) == 4
    assert sorted(json.loads(line)["reward"] for line in first) == [0.0, 0.0, 1.0, 1.0]
    # The evaluation: every sample answers 4: task 2 + 2 right twice, task 2 + 3 never.
    assert "pass@1" in result.output and "pass@2" in result.output and "maj@n" in result.output
    (math_,) = json.loads(output.with_suffix(".report.json").read_text())["sources"]
    assert (math_["tasks"], math_["samples"], math_["scored"]) == (2, 4, 4)
    assert math_["pass_at_k"] == {"1": 0.5, "2": 0.5}
    assert math_["majority"] == 0.5
    # A rerun (e.g. after a crash) gets the server's groups back: nothing runs twice.
    calls = len(llm.calls)
    result = run()
    assert result.exit_code == 0, result.output
    assert "2 tasks were already on the server" in result.output
    assert sorted(output.read_text().splitlines()) == sorted(first)
    assert len(llm.calls) == calls
    status = httpx.get(f"{server.url}/v1/status", headers={"Authorization": "Bearer tok"}).json()
    assert status["finished"] == {"completed": 4}
    # --resume: the rows in the output are not even asked for.
    result = run("--resume")
    assert result.exit_code == 0 and "resumed: 2 of 2 rows were already in" in result.output
    assert len(output.read_text().splitlines()) == 4
    result = run(token="wrong")
    assert result.exit_code == 2 and "HTTP 401" in result.output

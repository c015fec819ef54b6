"""``rollserve datasets validate``: per-row report, summary, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rollserve.cli import app

runner = CliRunner()
WIDE = {"COLUMNS": "250"}
GOOD = [
    {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}, "n": 2, "task_id": "add-1"},
    {"data_source": "code", "instance": {"problem": "Print 1.", "tests": [{"input": "", "output": "1\n"}]}},
]
BAD = [
    {"data_source": "math", "instance": {"answer": "4"}, "task_id": "no-question"},
    {"data_source": "nope", "instance": {}},
    {"data_source": "math", "instance": {"question": "q", "answer": "1"}, "n": 0},
]


def jsonl(tmp_path, rows, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def validate(*args):
    return runner.invoke(app, ["datasets", "validate", *args], env=WIDE)


def test_a_valid_file(tmp_path):
    result = validate(jsonl(tmp_path, GOOD))
    assert result.exit_code == 0, result.output
    assert "add-1" in result.output and "OK" in result.output
    assert "2 ok, 0 invalid (code: 1 ok, 0 invalid, math: 1 ok, 0 invalid)" in result.output


def test_invalid_rows_are_named_with_the_field(tmp_path):
    result = validate(jsonl(tmp_path, GOOD + BAD))
    assert result.exit_code == 1
    out = result.output
    assert "no-question" in out and "instance.question: required" in out
    assert "unknown data_source 'nope'" in out and "math_python" in out  # lists the known ones
    assert "n: Input should be greater than or equal to 1" in out
    assert "2 ok, 3 invalid" in out


def test_json_report(tmp_path):
    result = validate(jsonl(tmp_path, GOOD + BAD), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [r["ok"] for r in report["rows"]] == [True, True, False, False, False]
    assert report["rows"][2] == {
        "row": 3,
        "task_id": "no-question",
        "data_source": "math",
        "ok": False,
        "error": report["rows"][2]["error"],
    }
    assert report["rows"][2]["error"].startswith("instance.question: required")
    assert report["summary"]["by_data_source"]["math"] == {"ok": 1, "invalid": 2}
    assert report["summary"]["ok"] == 2 and report["summary"]["invalid"] == 3


def test_max_errors_and_the_rows_listed(tmp_path):
    result = validate(jsonl(tmp_path, GOOD + BAD), "--max-errors", "1")
    assert result.exit_code == 1 and "stopped after 1 invalid rows" in result.output
    assert "2 rows not checked" in result.output
    result = validate(jsonl(tmp_path, GOOD + BAD), "--rows", "errors")
    assert "add-1" not in result.output and "2 valid rows not listed" in result.output


def test_bare_instances_with_a_data_source():
    from importlib.resources import files

    path = str(files("rollserve") / "data" / "math_tasks.jsonl")
    result = validate(path, "--data-source", "math")
    assert result.exit_code == 0 and "arith-add-1" in result.output
    result = validate(path)  # they are not tasks: each row says what to do
    assert result.exit_code == 1 and "--data-source" in result.output


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"data_source": "math", "instance": {}}\n{"data_source": \n', "line 2: not valid JSON"),
        (None, "no such file"),
    ],
)
def test_a_bad_file_exits_2(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    if content is not None:
        path.write_text(content)
    result = validate(str(path))
    assert result.exit_code == 2 and message in result.output


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(GOOD), good)
    pq.write_table(pa.Table.from_pylist([GOOD[0], BAD[0]]), bad)
    result = validate(str(good))
    assert result.exit_code == 0, result.output
    assert "2 ok, 0 invalid" in result.output
    result = validate(str(bad), "--json")
    assert result.exit_code == 1
    rows = json.loads(result.stdout)["rows"]
    assert [(r["row"], r["ok"]) for r in rows] == [(1, True), (2, False)]
    assert rows[1]["error"].startswith("instance.question: required")


@pytest.mark.parametrize(
    "name, data_source, count",
    [("swe-mini", "swe", 15), ("code", "code", 12), ("stem", "stem", 34), ("math", "math", 32), ("easy", "stem", 16)],
)
def test_bundled_sets_by_name(name, data_source, count):
    result = validate(name, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["summary"]["ok"] == count and report["summary"]["invalid"] == 0
    assert {r["data_source"] for r in report["rows"]} == {data_source}

"""Reading dataset files (JSONL, gzip, parquet) into API tasks, and their client ids."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from rollserve.datasets import DatasetError, client_id, dataset_name, read_dataset

MATH = {"question": "What is 2 + 2?", "answer": "4"}


def write_jsonl(path, rows, blank_lines=False):
    lines = [json.dumps(r) for r in rows]
    if blank_lines:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_task_rows_with_line_numbers_and_labels(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"data_source": "math", "instance": MATH, "n": 2, "task_id": "t-1"},
            {"data_source": "math", "instance": {**MATH, "task_id": "inner"}},
            [1, 2],
            {"instance": MATH, "metadata": {"split": "test"}, "task_id": 7},
            {"data_source": "math", "question": "no instance"},
        ],
        blank_lines=True,
    )
    rows = read_dataset(path)
    assert [r.number for r in rows] == [1, 3, 4, 5, 6]  # line 2 is blank
    first, second, listed, third, bare = rows
    assert first.task == {"data_source": "math", "instance": MATH, "n": 2, "metadata": {"task_id": "t-1"}}
    assert first.label == "t-1" and first.data_source == "math" and first.error is None
    assert second.label == "inner"  # from the instance
    assert listed.task is None and listed.error == "row: must be a JSON object, got list"
    assert third.task["metadata"] == {"task_id": 7, "split": "test"} and third.label == "7"
    assert third.data_source is None  # left for the check to name
    assert bare.task is None and bare.error.startswith("instance: required")
    assert "--data-source" in bare.error


def test_bare_instances_with_a_data_source(tmp_path):
    path = write_jsonl(
        tmp_path / "swe.jsonl", [{"instance_id": "django__django-1", "repo": "x"}, {"question": "q", "answer": 1}]
    )
    rows = read_dataset(path, data_source="swe")
    assert rows[0].task == {"data_source": "swe", "instance": {"instance_id": "django__django-1", "repo": "x"}}
    assert rows[0].label == "django__django-1" and rows[1].label is None


def test_gzip_jsonl(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"data_source": "math", "instance": MATH}) + "\n")
    (row,) = read_dataset(path)
    assert row.instance == MATH
    assert dataset_name(path) == "d"


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"data_source": "math", "instance": {}}\n\n{"data_source": oops}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl, line 3: not valid JSON"):
        read_dataset(path)


@pytest.mark.parametrize(
    "content, message", [(None, "no such file"), ("", "no rows"), (b"\xff\xfe\x00", "cannot be read as JSONL")]
)
def test_unreadable_files(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        read_dataset(path)


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "code",
                "instance": {"problem": "p", "tests": [{"input": "1", "output": "1"}], "asserts": None},
                "n": 2,
            },
            {"data_source": "code", "instance": {"problem": "p", "tests": None, "asserts": "assert 1"}, "n": None},
        ]
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    first, second = read_dataset(path)
    assert (first.number, second.number) == (1, 2)
    # Nulls a parquet schema gives every row are absent keys, as in the source data.
    assert first.task == {
        "data_source": "code",
        "n": 2,
        "instance": {"problem": "p", "tests": [{"input": "1", "output": "1"}]},
    }
    assert second.task == {"data_source": "code", "instance": {"problem": "p", "asserts": "assert 1"}}


def test_parquet_instance_as_json_text(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "math", "instance": json.dumps(MATH)}]), path)
    (row,) = read_dataset(path)
    assert row.instance == MATH


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_text("nope")
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        read_dataset(path)


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match="pip install pyarrow"):
        read_dataset(path)


def test_client_ids_are_stable_valid_and_change_with_the_row_or_settings():
    task = {"data_source": "math", "instance": MATH, "n": 2}
    settings = {"sampling": {"temperature": 0.5}}
    first = client_id("my data set", 3, task, settings)
    assert first == client_id("my data set", 3, dict(task), {"sampling": {"temperature": 0.5}})
    assert re.fullmatch(r"[A-Za-z0-9._:/@+=-]+", first) and first.startswith("my_data_set/3-")
    assert client_id("my data set", 4, task, settings) != first
    assert client_id("my data set", 3, {**task, "n": 3}, settings) != first
    assert client_id("my data set", 3, task, {"sampling": {"temperature": 1.0}}) != first
    assert client_id("d", 3, {**task, "id": "mine"}) == "mine"

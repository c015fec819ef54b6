"""The names ``workspace_file_problem`` refuses are those a sandbox's start could not
write (each refused set fails ``SandboxFolders.write_files``), and the names it accepts
at its limits are written: the check at submission is the writer's own rule, early."""

from __future__ import annotations

import pytest

from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.workspace_files import (
    MAX_DEPTH,
    MAX_PART_BYTES,
    workspace_file_problem,
)

FAILING_WRITES = {
    "file and folder": {"a": "", "a/b": ""},
    "folder then file": {"a/b": "", "a": ""},
    "the workspace itself": {".": ""},
    "NUL": {"a\0b": ""},
    "300 characters": {"x" * 300: ""},
    "2,000 folders deep": {"/".join(["d"] * 2000) + "/f": ""},
    "outside": {"../up": ""},
}


@pytest.mark.parametrize("files", FAILING_WRITES.values(), ids=FAILING_WRITES.keys())
def test_every_refused_set_fails_the_sandbox_start(tmp_path, files):
    assert workspace_file_problem(files) is not None
    folders = SandboxFolders.create(tmp_path, "test-refused")
    with pytest.raises((OSError, RecursionError, ValueError)):
        folders.write_files(SandboxSpec(files=files))


def test_names_at_the_limits_are_written(tmp_path):
    files = {
        "a/b": "1",
        "a/c": "2",
        "/workspace/e/f.py": "3",
        "x" * MAX_PART_BYTES: "4",
        "/".join(["d"] * (MAX_DEPTH - 1)) + "/f": "5",
        "é" * (MAX_PART_BYTES // 2): "6",
    }
    assert workspace_file_problem(files) is None
    folders = SandboxFolders.create(tmp_path, "test-limits")
    folders.write_files(SandboxSpec(files=files))
    assert (folders.workspace / "e" / "f.py").read_text() == "3"
    assert (folders.workspace / ("/".join(["d"] * (MAX_DEPTH - 1)) + "/f")).read_text() == "5"


@pytest.mark.parametrize(
    ("files", "name"),
    [
        ({"a": "1", "/workspace/a": "2"}, "/workspace/a"),
        ({"a/./b": ""}, "a/./b"),
        ({"x" * (MAX_PART_BYTES + 1): ""}, "x" * (MAX_PART_BYTES + 1)),
        ({"/".join(["d"] * MAX_DEPTH) + "/f": ""}, "/".join(["d"] * MAX_DEPTH) + "/f"),
        ({"/".join(["n" * 200] * 6): ""}, "/".join(["n" * 200] * 6)),  # over MAX_PATH_BYTES
    ],
)
def test_ambiguous_or_oversized_names_are_refused_by_name(files, name):
    found = workspace_file_problem(files)
    assert found is not None and found[0] == name

"""A ``gateway`` task is checked whole at submission: what would pay for nothing (a
blank answer) or fail the sandbox's start (files it cannot write) is a 422 naming the
field, never accepted and then masked at INIT or scored."""

from __future__ import annotations

import pytest

from rollserve.contract.validation import field_name

COMMAND = "python3 harness.py"
MAX_PART_BYTES = 255  # the limits docs/gateway.md documents for instance.files
MAX_DEPTH = 32


async def _submit(client, instance: dict):
    return await client.post("/v1/rollouts", json={"tasks": [{"data_source": "gateway", "instance": instance}]})


def _field(r) -> str:
    assert r.status_code == 422, r.text
    return r.json()["errors"][0]["field"]


@pytest.mark.parametrize("answer", ["   ", "\n\t ", "\u00a0\u2003"])
async def test_a_blank_answer_is_refused(make_api, answer):
    # The reply is compared stripped: a blank answer would pay an empty reply 1.0.
    _, client = await make_api()
    r = await _submit(client, {"answer": answer})
    assert _field(r) == "tasks[0].instance.answer"
    assert "blank" in r.json()["errors"][0]["message"]


async def test_an_answer_with_whitespace_around_it_is_accepted(make_api):
    _, client = await make_api()
    r = await _submit(client, {"answer": "  42\n"})
    assert r.status_code == 202, r.text


DEEP = "/".join(["d"] * 2000) + "/f"
LONG = "x" * 300
UNWRITABLE = [
    ({"a": "", "a/b": ""}, "a"),  # a file that is also a folder
    ({"a/b": "", "a": ""}, "a"),  # ...whichever comes first
    ({".": ""}, "."),
    ({"./a": ""}, "./a"),
    ({"a/./b": ""}, "a/./b"),
    ({"/workspace": ""}, "/workspace"),
    ({"/workspace/": ""}, "/workspace/"),
    ({"a\0b": ""}, "a\0b"),
    ({LONG: ""}, LONG),
    ({"dir/" + LONG: ""}, "dir/" + LONG),
    ({DEEP: ""}, DEEP),
    ({"a": "1", "/workspace/a": "2"}, "/workspace/a"),  # one file, two texts
    ({"a/": ""}, "a/"),
    ({"a//b": ""}, "a//b"),
]


@pytest.mark.parametrize(("files", "name"), UNWRITABLE, ids=[f"case{i}" for i in range(len(UNWRITABLE))])
async def test_files_a_sandbox_cannot_write_are_refused_naming_the_file(make_api, files, name):
    _, client = await make_api()
    r = await _submit(client, {"answer": "42", "command": COMMAND, "files": files})
    assert _field(r) == "tasks[0]." + field_name(("instance", "files", name))


async def test_files_at_the_limits_are_accepted(make_api):
    _, client = await make_api()
    files = {
        "a/b": "1",
        "a/c": "2",
        "/workspace/e/f.py": "3",
        "x" * MAX_PART_BYTES: "4",
        "/".join(["d"] * (MAX_DEPTH - 1)) + "/f": "5",
        "é" * (MAX_PART_BYTES // 2): "6",
    }
    r = await _submit(client, {"answer": "42", "command": COMMAND, "files": files})
    assert r.status_code == 202, r.text

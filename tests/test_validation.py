"""Field names in errors: one spelling for the API, the CLI and dataset reports; and the
JSON a request may carry."""

import json

import pytest
from pydantic import BaseModel, ValidationError

from rollserve.validation import JSONInputError, check_json, describe, field_name, parse_json


class Task(BaseModel):
    n: int


class Batch(BaseModel):
    tasks: list[Task]


@pytest.mark.parametrize(
    "loc, name",
    [
        (("body", "tasks", 0, "n"), "tasks[0].n"),
        (("query", "wait"), "wait"),
        (("tasks", 1, "instance", "question"), "tasks[1].instance.question"),
        (("body",), "body"),
        ((), "body"),
    ],
)
def test_field_names(loc, name):
    assert field_name(loc) == name


def test_describe_names_every_problem():
    with pytest.raises(ValidationError) as caught:
        Batch(tasks=[{"n": 1}, {"n": "x"}, {}])
    assert describe(caught.value) == (
        "tasks[1].n: Input should be a valid integer, unable to parse string as an integer; tasks[2].n: Field required"
    )


@pytest.mark.parametrize(
    "text, where, says",
    [
        ('{"a": [1, {"b": "\\ud800"}]}', "a[1].b", "surrogate"),
        ('{"\\udfff": 1}', "\\udfff", "surrogate"),
        ('{"a": 9223372036854775808}', "a", "64-bit"),
        ('{"a": -9223372036854775809}', "a", "64-bit"),
        ('{"a": 1e400}', "a", "finite"),
        ('{"a": NaN}', "body", "NaN"),
        ('{"a": ' + "[" * 65 + "]" * 65 + "}", "a" + "[0]" * 12 + "...", "deeper than 64"),
        ("[" * 100_000 + "]" * 100_000, "body", "deeper than 64"),
        ('{"a": 1', "body", "not valid JSON"),
    ],
)
def test_json_no_part_of_rollserve_can_hold_is_refused_where_it_is(text, where, says):
    with pytest.raises(JSONInputError) as caught:
        parse_json(text.encode())
    assert field_name(caught.value.loc) == where and says in caught.value.message


def test_json_within_the_bounds_is_kept_as_parsed():
    text = '{"a": [9223372036854775807, -9223372036854775808, 1.5, "é ✓ 🙂", null, true]}'
    assert parse_json(text.encode()) == json.loads(text)
    assert parse_json(("[" * 64 + "]" * 64).encode()) is not None
    with pytest.raises(JSONInputError, match="UTF-8"):
        parse_json(b'{"a": "\xff"}')


def test_check_json_walks_without_recursion():
    deep: list = []
    for _ in range(50_000):  # built, not parsed: deeper than any recursion limit
        deep = [deep]
    with pytest.raises(JSONInputError, match="deeper than 64"):
        check_json(deep)


def test_field_names_are_printable_and_short():
    assert field_name(("metadata", "\ud800")) == "metadata.\\ud800"
    assert field_name(("k" * 500,)) == "k" * 80 + "..."

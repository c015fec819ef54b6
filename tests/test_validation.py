"""Field names in errors: one spelling for the API, the CLI and dataset reports."""

import pytest
from pydantic import BaseModel, ValidationError

from rollserve.validation import describe, field_name


class Task(BaseModel):
    n: int


class Batch(BaseModel):
    tasks: list[Task]


@pytest.mark.parametrize("loc, name", [
    (("body", "tasks", 0, "n"), "tasks[0].n"),
    (("query", "wait"), "wait"),
    (("tasks", 1, "instance", "question"), "tasks[1].instance.question"),
    (("body",), "body"),
    ((), "body"),
])
def test_field_names(loc, name):
    assert field_name(loc) == name


def test_describe_names_every_problem():
    with pytest.raises(ValidationError) as caught:
        Batch(tasks=[{"n": 1}, {"n": "x"}, {}])
    assert describe(caught.value) == ("tasks[1].n: Input should be a valid integer, unable to parse "
                                      "string as an integer; tasks[2].n: Field required")

"""MathHandler.validate: every rejection names the field at fault."""

from __future__ import annotations

import pytest

from rollserve.datasets import bundled_rows
from rollserve.handlers.base import InvalidInstance
from rollserve.handlers.math.handler import MathHandler

handler = MathHandler(ctx=None)  # validate needs no context


@pytest.mark.parametrize(
    "instance, field, words",
    [
        ({}, "instance.question", "required"),
        ({"answer": "3"}, "instance.question", "required"),
        ({"question": "", "answer": "3"}, "instance.question", "non-empty"),
        ({"question": 5, "answer": "3"}, "instance.question", "string"),
        ({"question": "1+2?"}, "instance.answer", "required"),
        ({"question": "1+2?", "answer": None}, "instance.answer", "string or a number"),
        ({"question": "1+2?", "answer": True}, "instance.answer", "string or a number"),
        ({"question": "1+2?", "answer": "  "}, "instance.answer", "empty"),
        ({"question": "1+2?", "answer": "3", "system_prompt": 1}, "instance.system_prompt", "string"),
        ({"question": "q", "answer": "1", "dataset": "gcd"}, "instance", "not both"),
        ({"dataset": "foo", "seed": 1}, "instance.dataset", "unknown reasoning-gym dataset 'foo'"),
        ({"dataset": 3, "seed": 1}, "instance.dataset", "string"),
        ({"dataset": "gcd"}, "instance.seed", "required"),
        ({"dataset": "gcd", "seed": "1"}, "instance.seed", "integer"),
        ({"dataset": "gcd", "seed": 1, "index": -1}, "instance.index", ">= 0"),
        ({"dataset": "gcd", "seed": 1, "index": 1.5}, "instance.index", "integer"),
        ({"dataset": "gcd", "seed": 1, "config": []}, "instance.config", "object"),
        ({"dataset": "gcd", "seed": 1, "config": {"colour": 1}}, "instance.config.colour", "unknown option"),
        ({"dataset": "gcd", "seed": 1, "config": {"seed": 2}}, "instance.config.seed", "instance.seed"),
        ({"dataset": "gcd", "seed": 1, "config": {"size": 0}}, "instance.config.size", ">= 1"),
        ({"dataset": "gcd", "seed": 1, "index": 10, "config": {"size": 10}}, "instance.index", "< config.size"),
        ({"dataset": "gcd", "seed": 1, "config": {"min_value": 0}}, "instance.config", "rejected by 'gcd'"),
    ],
)
def test_rejections_name_the_field(instance, field, words):
    with pytest.raises(InvalidInstance) as info:
        handler.validate(instance)
    assert info.value.field == field
    assert words in info.value.message
    assert str(info.value).startswith(f"{field}: ")


def test_non_object_instance():
    with pytest.raises(InvalidInstance) as info:
        handler.validate(["question"])  # type: ignore[arg-type]
    assert info.value.field == "instance"


def test_unknown_dataset_lists_known_names_and_suggests():
    with pytest.raises(InvalidInstance) as info:
        handler.validate({"dataset": "basic_arithmetc", "seed": 1})
    message = info.value.message
    assert "known: ab, acre" in message
    assert "did you mean basic_arithmetic" in message


@pytest.mark.parametrize(
    "instance",
    [
        {"question": "What is 7 + 5?", "answer": "12"},
        {"question": "What is 7 + 5?", "answer": 12},
        {"question": "Half?", "answer": "\\frac{1}{2}", "system_prompt": "Be brief."},
        {"dataset": "gcd", "seed": 0},
        {"dataset": "basic_arithmetic", "seed": 3, "index": 999},  # past the default size
        {"dataset": "basic_arithmetic", "seed": 3, "config": {"max_terms": 2, "operators": ["+"]}},
    ],
)
def test_accepts_valid_instances(instance):
    handler.validate(instance)


def test_bundled_tasks_are_valid():
    tasks = bundled_rows("math")
    assert len(tasks) >= 24
    assert any("dataset" in t for t in tasks) and any("question" in t for t in tasks)
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    for task in tasks:
        handler.validate(task)

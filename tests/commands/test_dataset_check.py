"""Offline checks of dataset rows: the API's task model, then the handler's validate;
and the images a dataset needs."""

from __future__ import annotations

from rollserve.commands.dataset_check import DatasetChecker, images_needed, offline_context
from rollserve.datasets import DatasetRow
from rollserve.handlers.registry import HandlerRegistry
from tests.dataset_helpers import ImageHandler, registry_with_images

MATH = {"question": "What is 2 + 2?", "answer": "4"}


def row(number, task, error=None, label=None):
    return DatasetRow(number, task, error, label)


def test_rows_are_checked_like_a_submission():
    checker = DatasetChecker(HandlerRegistry(discover=False))
    checks = checker.check_all(
        [
            row(1, {"data_source": "math", "instance": MATH, "n": 2}),
            row(2, {"data_source": "math", "instance": {"answer": "4"}}),
            row(3, {"data_source": "nope", "instance": {}}),
            row(4, {"data_source": "math", "instance": MATH, "n": 0, "colour": "red"}),
            row(5, {"data_source": "math", "instance": MATH, "sampling": {"temperature": -1}}),
            row(6, None, "row: must be a JSON object, got list"),
            row(7, {"data_source": "code", "instance": {"problem": "p"}}),
        ]
    )
    errors = [c.error for c in checks]
    assert checks[0].ok and errors[0] is None
    assert errors[1].startswith("instance.question: required")
    assert errors[2].startswith("data_source: unknown data_source 'nope' (known: code, gateway, harbor, math")
    assert errors[3] == ("n: Input should be greater than or equal to 1; colour: Extra inputs are not permitted")
    assert errors[4].startswith("sampling.temperature: Input should be greater than or equal to 0")
    assert errors[5] == "row: must be a JSON object, got list"
    assert errors[6].startswith("instance: give the hidden tests")


def test_checking_loads_no_model_and_starts_nothing():
    context = offline_context()
    checker = DatasetChecker(HandlerRegistry(discover=False), context)
    for source, instance in (
        ("math", MATH),
        ("code", {"problem": "p", "asserts": "assert f(1) == 1", "entry_point": "f"}),
    ):
        assert checker.check(row(1, {"data_source": source, "instance": instance})).ok
    assert context.tokenizer._made is None  # the lazy tokenizer was never built
    assert context.scoring._pool is None
    assert context.sandboxes.runtime is None and context.sandboxes.name == "bubblewrap"


def test_a_data_source_only_the_remote_server_has_is_left_to_it():
    checker = DatasetChecker(HandlerRegistry(discover=False), remote_handlers=["their_task"])
    assert checker.check(row(1, {"data_source": "their_task", "instance": {"x": 1}})).ok
    assert not checker.check(row(2, {"data_source": "other", "instance": {}})).ok


def test_a_handler_that_cannot_be_built_or_crashes_is_reported_per_row():
    class Needy(ImageHandler):
        def __init__(self, ctx):
            raise RuntimeError("needs a GPU")

    class Buggy(ImageHandler):
        def validate(self, instance):
            raise KeyError("oops")

    registry = HandlerRegistry(discover=False)
    registry.register("needy", Needy)
    registry.register("buggy", Buggy)
    checker = DatasetChecker(registry)
    first, second = checker.check_all(
        [row(1, {"data_source": "needy", "instance": {}}), row(2, {"data_source": "buggy", "instance": {}})]
    )
    assert first.error == ("data_source: handler 'needy' cannot be built here: RuntimeError: needs a GPU")
    assert second.error == "instance: buggy.validate() failed: KeyError: 'oops'"


def test_max_errors_stops_early():
    checker = DatasetChecker(HandlerRegistry(discover=False))
    rows = [row(i, {"data_source": "math", "instance": {}}) for i in range(1, 10)]
    assert len(checker.check_all(rows, max_errors=3)) == 3


def test_images_needed_deduplicates_and_skips_what_has_none():
    checker = DatasetChecker(registry_with_images())
    rows = [
        row(1, {"data_source": "imaged", "instance": {"image": "docker://a:1"}}),
        row(2, {"data_source": "imaged", "instance": {"images": ["docker://b:1", "docker://a:1"]}}),
        row(3, {"data_source": "math", "instance": MATH}),  # no images()
        row(4, {"data_source": "imaged", "instance": {}}),  # invalid: left out
        row(5, {"data_source": "imaged", "instance": {"image": "x", "explode": True}}),
    ]
    needed, errors = images_needed(checker, checker.check_all(rows))
    assert needed == {"docker://a:1": [1, 2], "docker://b:1": [2]}
    assert errors == [(5, "imaged.images() failed: RuntimeError: cannot list images")]

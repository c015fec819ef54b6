"""Fixtures the swe handler's bubblewrap tests share: the toy instance and a handler
factory whose mirrors hold the toy's repository; the apptainer stand-in of the sandbox
tests (``fake_apptainer``), for the apptainer tests here."""

from __future__ import annotations

import pytest

from rollserve.handlers.base import HandlerContext
from rollserve.handlers.swe import SWEHandler
from rollserve.sandbox.registry import LazyRuntime
from tests.handlers.swe import toy_repo
from tests.sandbox.test_apptainer import fake_apptainer  # noqa: F401 (a fixture, shared)


@pytest.fixture
def toy(tmp_path):
    return toy_repo.build(tmp_path / "mirror")


@pytest.fixture
def handler(tokenizer, tmp_path):
    def make(**options) -> SWEHandler:
        ctx = HandlerContext(
            tokenizer=tokenizer,
            scoring=None,
            sandboxes=LazyRuntime("bubblewrap", tmp_path / "state"),
            options={"swe": {"mirrors": [str(tmp_path / "mirror")], **options}},
        )
        return SWEHandler(ctx)

    return make

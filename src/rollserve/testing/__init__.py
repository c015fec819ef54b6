"""Test doubles for users and for rollserve's own tests (no GPU, no model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.testing.fake_llamacpp import FakeLlamaCpp
    from rollserve.testing.fake_server import RecordedCall, fake_logprob
    from rollserve.testing.fake_sglang import FakeSGLang
    from rollserve.testing.fake_vllm import FakeVLLM

# Imported on first use, so `python -m rollserve.testing.fake_vllm` runs the module
# once (an eager import here makes runpy warn about a double import).
_HOMES: dict[str, str] = {
    "FakeLlamaCpp": "rollserve.testing.fake_llamacpp",
    **dict.fromkeys(("RecordedCall", "fake_logprob"), "rollserve.testing.fake_server"),
    "FakeSGLang": "rollserve.testing.fake_sglang",
    "FakeVLLM": "rollserve.testing.fake_vllm",
}
__all__ = ["FakeLlamaCpp", "FakeSGLang", "FakeVLLM", "RecordedCall", "fake_logprob"]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

"""Test doubles for users and for rollserve's own tests (no GPU, no model)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollserve.testing.fake_llamacpp import FakeLlamaCpp
    from rollserve.testing.fake_server import RecordedCall, fake_logprob
    from rollserve.testing.fake_sglang import FakeSGLang
    from rollserve.testing.fake_vllm import FakeVLLM

_WHERE = {
    "FakeVLLM": "fake_vllm",
    "FakeSGLang": "fake_sglang",
    "FakeLlamaCpp": "fake_llamacpp",
    "RecordedCall": "fake_server",
    "fake_logprob": "fake_server",
}
__all__ = ["FakeLlamaCpp", "FakeSGLang", "FakeVLLM", "RecordedCall", "fake_logprob"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so `python -m rollserve.testing.fake_vllm` runs the
    # module once (an eager import here makes runpy warn about a double import).
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"rollserve.testing.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'rollserve.testing' has no attribute {name!r}")

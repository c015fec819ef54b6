"""Test doubles for users and for rollserve's own tests (no GPU, no model)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollserve.testing.fake_vllm import FakeVLLM, RecordedCall, fake_logprob

__all__ = ["FakeVLLM", "RecordedCall", "fake_logprob"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so `python -m rollserve.testing.fake_vllm` runs the
    # module once (an eager import here makes runpy warn about a double import).
    if name in __all__:
        from rollserve.testing import fake_vllm

        return getattr(fake_vllm, name)
    raise AttributeError(f"module 'rollserve.testing' has no attribute {name!r}")

"""Where the gateway works on a request (``agent.gateway.bounds.sized``): one up to
``INLINE_BYTES`` on the event loop (less than a hand-off to a thread and back), a larger
one, or one of unknown size, on a worker thread, so that no conversation stalls the
loop that serves every rollout."""

from __future__ import annotations

import threading

import pytest

from rollserve.agent.gateway.bounds import INLINE_BYTES, sized


def _thread() -> int:
    return threading.get_ident()


async def test_a_small_request_is_worked_on_the_loop():
    assert await sized(INLINE_BYTES, _thread) == threading.get_ident()
    assert await sized(0, _thread) == threading.get_ident()


@pytest.mark.parametrize("size", [INLINE_BYTES + 1, 8 << 20, None])
async def test_a_large_or_unknown_request_is_worked_on_a_thread(size):
    assert await sized(size, _thread) != threading.get_ident()


async def test_its_error_reaches_the_caller_from_either_place():
    def refuse(value: int) -> int:
        raise ValueError(f"refused {value}")

    for size in (1, INLINE_BYTES + 1):
        with pytest.raises(ValueError, match=f"refused {size}"):
            await sized(size, refuse, size)

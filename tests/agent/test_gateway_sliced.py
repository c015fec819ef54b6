"""A request's messages validated a slice at a time (``agent.gateway.sliced``) give
what a whole-model validation gives: the same request, the same first error at the
same index, through both wires' parsers."""

from __future__ import annotations

import json
import threading

import pytest

from rollserve.agent.gateway import anthropic_wire, wire
from rollserve.agent.gateway.base import GatewayRefusal
from rollserve.agent.gateway.sliced import SLICE


def _chat(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]


def test_a_long_request_is_the_same_request():
    messages = _chat(3 * SLICE + 5)
    parsed = wire.parse_request(json.dumps({"model": "p", "messages": messages}).encode())
    assert [m.model_dump(exclude_none=True) for m in parsed.messages] == messages


@pytest.mark.parametrize("bad", [3, SLICE + 7, 3 * SLICE + 1])
def test_the_first_error_names_its_index(bad: int):
    messages = _chat(3 * SLICE + 5)
    messages[bad]["role"] = "wizard"
    messages[-1]["role"] = "wizard"  # (a later one is not the first)
    with pytest.raises(GatewayRefusal) as refused:
        wire.parse_request(json.dumps({"model": "p", "messages": messages}).encode())
    assert refused.value.param == f"messages[{bad}].role", refused.value.message
    blocks = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
              for m in messages]
    with pytest.raises(GatewayRefusal) as refused:
        anthropic_wire.parse_request(json.dumps({"model": "p", "max_tokens": 4,
                                                 "messages": blocks}).encode())
    assert refused.value.message.startswith(f"messages[{bad}].role"), refused.value.message


def _body(size: int, role: str = "user") -> bytes:
    """A chat request of about ``size`` bytes."""
    return json.dumps({"model": "p", "messages": [
        {"role": role, "content": "x" * max(1, size - 70)}]}).encode()


@pytest.mark.parametrize("size, inline", [(200, True), (wire.INLINE_BYTES, True),
                                          (wire.INLINE_BYTES + 1, False), (4 * wire.INLINE_BYTES, False)])
async def test_a_small_body_is_parsed_on_the_loop_a_large_one_on_a_thread(size: int, inline: bool):
    raw = _body(size)
    raw += b" " * (size - len(raw))  # (JSON's trailing white space: exactly ``size`` bytes)
    assert len(raw) == size
    threads: list[int] = []

    def parse(body: bytes):
        threads.append(threading.get_ident())
        return wire.parse_request(body)

    parsed = await wire.parse_off_loop(parse, raw)
    assert (threads == [threading.get_ident()]) is inline, (len(raw), threads)
    assert parsed == wire.parse_request(raw)


@pytest.mark.parametrize("size", [200, 4 * wire.INLINE_BYTES])
async def test_a_bad_body_is_the_same_refusal_on_the_loop_or_a_thread(size: int):
    with pytest.raises(GatewayRefusal) as caught:
        await wire.parse_off_loop(wire.parse_request, _body(size, role="wizard"))
    assert caught.value.param == "messages[0].role", caught.value.message

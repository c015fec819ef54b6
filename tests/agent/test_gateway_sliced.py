"""A request's messages validated a slice at a time (``agent.gateway.sliced``) give
what a whole-model validation gives: the same request, the same first error at the
same index, through both wires' parsers."""

from __future__ import annotations

import json

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
    blocks = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    with pytest.raises(GatewayRefusal) as refused:
        anthropic_wire.parse_request(json.dumps({"model": "p", "max_tokens": 4, "messages": blocks}).encode())
    assert refused.value.message.startswith(f"messages[{bad}].role"), refused.value.message

"""Every kind of gateway refusal (``agent.gateway.base``) has its answer in the one
table both servers use (``agent.gateway.wire.ERRORS``), and the answers are the
statuses and error shapes the harnesses' clients know."""

from __future__ import annotations

import json

import pytest

from rollserve.agent.gateway import anthropic_wire, base, wire
from rollserve.agent.gateway.base import GatewayRefusal

# Every refusal class base exports (it also exports constants, e.g. POLICY_MODEL).
KINDS = [
    kind
    for kind in (getattr(base, name) for name in base.__all__)
    if isinstance(kind, type) and issubclass(kind, GatewayRefusal) and kind is not GatewayRefusal
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_kind_has_an_answer(kind: type[GatewayRefusal]):
    refusal = kind("why") if kind is base.ContextLengthExceeded else kind("why", param="x")
    assert 400 <= wire.status(refusal) <= 599


# kind: status, OpenAI's type and code, Anthropic's type
ANSWERS = {
    base.BadRequest: (400, "invalid_request_error", None, "invalid_request_error"),
    base.ContextLengthExceeded: (400, "invalid_request_error", "context_length_exceeded", "invalid_request_error"),
    base.UnknownKey: (401, "authentication_error", "invalid_api_key", "authentication_error"),
    base.SessionEnded: (404, "invalid_request_error", "session_ended", "not_found_error"),
    base.UnknownRoute: (404, "invalid_request_error", "unknown_url", "not_found_error"),
    base.TimeLimit: (408, "timeout", "time_limit", "timeout_error"),
    base.BodyTooLarge: (413, "invalid_request_error", "request_too_large", "api_error"),
    base.TooManyCalls: (429, "rate_limit_error", "too_many_calls", "api_error"),
    base.BackendFailed: (502, "server_error", "backend_error", "api_error"),
}


def test_the_answers_are_the_wire_s():
    assert set(ANSWERS) == set(KINDS)
    for kind, (status, openai_type, code, anthropic_type) in ANSWERS.items():
        refusal = kind("the message")
        openai = json.loads(wire.error_body(refusal))["error"]
        anthropic = json.loads(anthropic_wire.error_body(refusal))["error"]
        assert wire.status(refusal) == status, kind
        assert (openai["type"], openai["code"]) == (openai_type, code), kind
        assert anthropic["type"] == anthropic_type, kind


def test_a_request_at_fault_names_its_field():
    openai = json.loads(wire.error_body(base.BadRequest("messages[2].role: bad", param="messages[2].role")))
    assert openai == {
        "error": {
            "message": "messages[2].role: bad",
            "type": "invalid_request_error",
            "param": "messages[2].role",
            "code": None,
        }
    }
    too_long = base.ContextLengthExceeded("This model's maximum context length is 8 tokens")
    assert json.loads(wire.error_body(too_long))["error"]["param"] == "messages"
    assert json.loads(anthropic_wire.error_body(too_long))["error"]["message"] == (
        "prompt is too long: This model's maximum context length is 8 tokens"
    )


def test_an_unlisted_kind_is_an_error_not_a_guess():
    class Unlisted(GatewayRefusal):
        pass

    with pytest.raises(TypeError, match="wire.ERRORS"):
        wire.status(Unlisted("x"))

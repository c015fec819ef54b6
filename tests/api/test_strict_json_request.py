"""``StrictJSONRequest.json()`` parses a body once, with ``parse_json`` and the route's
body type in strict mode, and keeps the value in its own attribute, not in
Starlette's private ``Request._json``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from rollserve.api import guards
from rollserve.api.errors import FieldHTTPError
from rollserve.api.guards import StrictJSONRequest


def _request(body: bytes, body_type: TypeAdapter[Any] | None = None) -> StrictJSONRequest:
    sent = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    return StrictJSONRequest(scope, receive, body_type)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    seen: list[bytes] = []
    real = guards.parse_json

    def counted(raw: bytes) -> Any:
        seen.append(raw)
        return real(raw)

    monkeypatch.setattr(guards, "parse_json", counted)
    return seen


@pytest.mark.parametrize("body, value", [(b'{"n": 1}', {"n": 1}), (b"null", None), (b"[]", [])])
async def test_a_body_is_parsed_once(parses: list[bytes], body: bytes, value: Any):
    request = _request(body)
    first = await request.json()
    assert first == value and await request.json() is first
    assert parses == [body]
    assert "_json" not in vars(request)  # Starlette's private cache is left alone


async def test_the_body_type_is_checked_strictly():
    assert await _request(b"1", TypeAdapter(int)).json() == 1
    with pytest.raises(FieldHTTPError) as refused:
        await _request(b'"1"', TypeAdapter(int)).json()
    assert refused.value.status_code == 422


async def test_what_parse_json_refuses_is_a_422():
    with pytest.raises(FieldHTTPError) as refused:
        await _request(b'{"x": NaN}').json()
    assert refused.value.status_code == 422 and "NaN" in refused.value.message

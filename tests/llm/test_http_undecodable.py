"""A server whose answer is not in the charset it names is a typed backend failure
(``LLMError``), never a ``UnicodeDecodeError`` escaping to an API route as a 500 (the
adapter check on a backend added at run time reads ``/v1/models`` through this)."""

from __future__ import annotations

import pytest
from aiohttp import web

from rollserve.errors import LLMError
from rollserve.llm.backends.http import HTTPClient


async def test_an_answer_not_in_its_charset_is_an_llm_error():
    async def models(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xfe\xfa", content_type="application/json", charset="utf-8")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = HTTPClient(f"http://127.0.0.1:{port}", "bad")
    try:
        with pytest.raises(LLMError, match="bad: GET"):
            await client.request_json("GET", "/v1/models", timeout=10)
    finally:
        await client.close()
        await runner.cleanup()

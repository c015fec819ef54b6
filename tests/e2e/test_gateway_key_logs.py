"""A gateway key is a credential (whoever holds it can call or end the rollout's
session): it never appears in the server's log. A real `rollserve serve` process with
its access log on, a real gateway session, its calls; then the captured log."""

from __future__ import annotations

import re

import httpx

from tests.waiting import wait_until


def _wait_for(condition, bound: float, what: str):
    return wait_until(condition, bound, what, interval=0.1)


def test_a_gateway_key_never_reaches_the_access_log(server_factory, fake_llm_thread):
    fake = fake_llm_thread(replies=["hello"], latency=0.0)
    server = server_factory("--backend", fake.url, "--log-level", "info").start()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post(
            "/v1/rollouts",
            json={
                "tasks": [{"data_source": "gateway", "instance": {"answer": "hello"}}],
                "sampling": {"max_tokens": 16},
                "agent": {"max_turns": 4},
            },
        )
        assert r.status_code == 202, r.text
        (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
        info = client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60}).json()
        key = info["key"]
        call = client.post(
            f"{info['base_url']}/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert call.status_code == 200, call.text
        made_up = "rsg-" + "x" * 32  # a wrong key is logged as little as a right one
        assert client.post(f"/v1/gateway/{made_up}/end").status_code == 401
        assert client.post(f"/v1/gateway/{key}/end").status_code == 200
        view = client.get(f"/v1/rollouts/{rollout_id}", params={"wait": 60}).json()
        assert view["done"] and view["result"]["reward"] == 1.0, view

    # The access log is on (the /end call is in it, redacted), and no key is anywhere.
    def logged() -> str | None:
        text = server.log.read_text()
        return text if re.search(r"POST /v1/gateway/\S+/end", text) else None

    log = _wait_for(logged, 30, "the access log line of the /end call")
    assert key.removeprefix("rsg-") not in log and made_up not in log
    assert "POST /v1/gateway/<redacted>/v1/chat/completions" in log
    assert "POST /v1/gateway/<redacted>/end" in log

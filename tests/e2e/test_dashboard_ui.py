"""The dashboard in a real browser (headless Chromium, the system's, driven by
Playwright) against a `rollserve serve` process behind --api-token, with the fake vLLM:
the live view updates while a batch runs without a reload, the results table filters,
a rollout's token view shows exactly its loss-mask-1 tokens (each sequence's, for a
harness that rewrote its history), and text the policy wrote stays text (no script of
its runs next to the token); and the page survives a bad link, an SSE line end cut across
chunks, a long trajectory, a -inf logprob and answers that arrive out of order. Screenshots
go to test-artifacts/ui/ (CI keeps them)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollserve.contract import NodeStatus

CHROMIUM = os.environ.get("ROLLSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
TOKEN = "ui-T0ken-7f3a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The policy's own text, sent back to the page: it must show as text and run nothing.
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> so \\boxed{5}'

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium on this machine (Debian: apt-get install chromium; or set ROLLSERVE_CHROMIUM)",
    ),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (the dev extra installs it)"),
]


def policy(prompt_ids: list[int], prompt: str) -> str:
    if "hostile" in prompt:
        return HOSTILE
    return "Adding: \\boxed{4}" if "2 + 2" in prompt else "I think \\boxed{7}"


def math(question: str, answer: str, n: int = 1) -> dict:
    return {"data_source": "math", "instance": {"question": question, "answer": answer}, "n": n}


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert sync_playwright is not None and CHROMIUM is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield launched
        finally:
            launched.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def submit(url: str, tasks: list[dict], **extra: object) -> list[str]:
    r = httpx.post(f"{url}/v1/rollouts", json={"tasks": tasks, **extra}, headers=AUTH, timeout=30)
    assert r.status_code == 202, r.text
    return [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]


def wait_done(url: str, ids: list[str]) -> list[dict]:
    results = []
    for rid in ids:
        view = httpx.get(f"{url}/v1/rollouts/{rid}", params={"wait": 120}, headers=AUTH, timeout=130).json()
        assert view["done"], view
        results.append(view["result"])
    return results


def test_dashboard_live_results_and_token_view(server_factory, fake_llm_thread, browser):
    llm = fake_llm_thread(replies=policy, latency=0.25)
    server = server_factory("--backend", llm.url, "--api-token", TOKEN, "--run-workers", "4").start()
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    # --- the token is asked once, then the live view follows a running batch ----------
    page.goto(f"{server.url}/ui")
    page.wait_for_selector("#login:not([hidden])", timeout=30_000)
    page.fill("#token-input", TOKEN)
    page.click("#login-form button")
    page.wait_for_selector("#live-finished", timeout=30_000)
    page.evaluate("window.__samePage = 'yes'")
    first = page.inner_text("#live-finished")
    batch = submit(server.url, [math("What is 2 + 2?", "4", n=8), math("What is 3 + 5?", "8", n=8)])
    seen_busy = False
    deadline = time.monotonic() + 90
    while page.inner_text("#live-finished") == first or not seen_busy:
        assert time.monotonic() < deadline, "the live view did not follow the batch"
        seen_busy = seen_busy or page.inner_text("[data-stage=run] .busy") != "0"
        page.wait_for_timeout(200)
    shot(page, "live.png")
    wait_done(server.url, batch)
    page.wait_for_function("() => document.querySelector('#live-finished').textContent === '16'", timeout=30_000)
    assert page.evaluate("window.__samePage") == "yes"  # updated in place, never reloaded
    assert page.inner_text("[data-stage=run] .busy") == "0"
    assert page.is_hidden("#live-nodes-box")  # one machine: no nodes

    # --- the Ray mode's per-node table, from NodeStatus as /v1/status carries it ---------
    node = NodeStatus(
        name="node-b",
        node_id="n2",
        alive=True,
        draining=True,
        slots=4,
        hosted=2,
        queued=0,
        busy={"run": 2},
        done={"init": 5, "run": 3, "eval": 3},
        placed=5,
        lost=1,
        sandboxes_open=2,
        reaped_at_start=3,
    )
    rows = page.evaluate(
        """(nodes) => {  // one synchronous render: no snapshot in between
        Live.nodes({nodes});
        return [...document.querySelectorAll('#live-nodes tr')].map((r) =>
            [...r.children].map((c) => c.textContent));
    }""",
        [node.model_dump(mode="json")],
    )
    assert rows[1] == ["node-b", "draining", "4", "2", "0 / 2 / 0", "5 / 3 / 3", "5", "1", "2", "3"]

    # --- an infrastructure failure (masked) and the policy's hostile text -------------------
    llm.fail_next(4, mode="error", status=500)  # every try of its one call (max_attempts)
    (infra,) = submit(server.url, [math("What is 2 + 2?", "4")])
    wait_done(server.url, [infra])
    (hostile,) = submit(server.url, [math("A hostile question: 2 + 3?", "5")])
    (result,) = wait_done(server.url, [hostile])

    # --- the results table filters ------------------------------------------------------
    page.click("nav a[data-view=results]")
    page.wait_for_selector(".result-row", timeout=30_000)
    page.wait_for_function("() => document.querySelectorAll('.result-row').length === 18", timeout=30_000)
    page.select_option("#filter-failure_kind", "infra")
    page.wait_for_function("() => document.querySelectorAll('.result-row').length === 1", timeout=30_000)
    assert page.get_attribute(".result-row", "data-id") == infra
    assert page.inner_text(".result-row .masked") == "masked"
    assert page.inner_text("#results-total") == "1 results match"
    page.select_option("#filter-failure_kind", "")
    page.select_option("#filter-masked", "false")
    page.wait_for_function("() => document.querySelectorAll('.result-row').length === 17", timeout=30_000)
    rewards = page.eval_on_selector_all(".result-row .reward", "cells => cells.map(c => c.textContent)")
    assert rewards.count("1.000") == 9 and rewards.count("0.000") == 8  # 2 + 2 and hostile; 3 + 5
    shot(page, "results.png")

    # --- one rollout: the token view holds exactly its sampled tokens ---------------------
    page.click(f".result-row[data-id='{hostile}']")
    page.wait_for_selector("#token-view .tokens", timeout=30_000)
    tokens = result["trajectory"]["tokens"]
    sampled = page.locator("#token-view .tokens .tok.m1").count()
    assert sampled == sum(tokens["loss_mask"]) > 0
    assert page.locator("#token-view .tokens .tok").count() == len(tokens["input_ids"])
    assert page.inner_text("#token-view .token-sampled") == str(sum(tokens["loss_mask"]))
    assert page.locator("#token-view .turn-mark").count() >= len(result["trajectory"]["turns"])
    # The policy's markup is shown verbatim, as text, and ran nothing.
    assert HOSTILE in page.inner_text("#messages")
    assert page.locator("#messages img, #messages script, #token-view img").count() == 0
    assert page.evaluate("window.__pwned") is None
    shot(page, "token-view.png")

    # --- a harness that rewrote its history: each sequence shown, each exact --------------
    (gateway,) = submit(server.url, [{"data_source": "gateway", "instance": {"answer": "x"}}])
    r = httpx.get(f"{server.url}/v1/rollouts/{gateway}/gateway", params={"wait": 60}, headers=AUTH, timeout=70)
    assert r.status_code == 200, r.text
    base = f"{server.url}{r.json()['base_url']}"
    history: list[dict] = [{"role": "user", "content": "first question"}]
    for question in ("second question", "third question"):
        reply = httpx.post(f"{base}/chat/completions", json={"model": "p", "messages": history}, timeout=60).json()
        history += [
            {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": question},
        ]
    truncated = history[2:]  # the oldest exchange dropped: a second sequence starts
    httpx.post(f"{base}/chat/completions", json={"model": "p", "messages": truncated}, timeout=60)
    httpx.post(f"{base.removesuffix('/v1')}/end", timeout=30)
    (split,) = wait_done(server.url, [gateway])
    sequences = split["trajectory"]["sequences"]
    assert split["trajectory"]["sequence_count"] == len(sequences) == 2
    page.goto(f"{server.url}/ui/#rollout/{gateway}")
    page.wait_for_selector("#token-view .tokens[data-sequence='1']", timeout=30_000)
    for index, sequence in enumerate(sequences):
        box = f"#token-view .tokens[data-sequence='{index}']"
        assert page.locator(f"{box} .tok.m1").count() == sum(sequence["loss_mask"]) > 0
        assert page.locator(f"{box} .tok").count() == len(sequence["input_ids"])
    shot(page, "sequences.png")

    check_the_page_survives(page, server.url, hostile, gateway)

    # --- the token never went into a URL -----------------------------------------------------
    assert urls and not [u for u in urls if TOKEN in u]
    assert not errors, errors


def check_the_page_survives(page: Page, url: str, first: str, second: str) -> None:
    """The page's functions with this server's data: a bad link, a stream whose line ends
    are cut across chunks, a long trajectory and a -inf logprob, responses that arrive
    out of order, a capped count."""
    failed = [
        s["id"]
        for s in httpx.get(f"{url}/v1/results/summaries", params={"status": "failed"}, headers=AUTH, timeout=30).json()[
            "summaries"
        ]
    ]
    assert failed
    page.evaluate("window.location.hash = '#rollout/%'")
    page.reload()  # a fresh page on that link
    # --- a malformed escape in the link: a message, and the live stream still runs -------
    page.wait_for_selector("#bad-link", timeout=30_000)
    page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'", timeout=30_000)
    page.wait_for_function(
        "() => /^[0-9,]+$/.test(document.querySelector('#live-finished').textContent)", timeout=30_000
    )

    # --- SSE: a "\r\n" cut between two chunks is one line end, not two ---------------------
    events = page.evaluate(
        """(chunks) => {
        const seen = [];
        const parse = sseParser((name, data) => seen.push([name, data]));
        chunks.forEach(parse);
        return seen;
    }""",
        [
            "event: status\r",
            '\ndata: {"a": 1}\r\n\r',
            "\nevent: status\r\ndata: 2\r",
            "\n\r",
            "\n: ping\r\n\r\n",
            "data: 3\r\rdata: 4\n\n",
        ],
    )
    assert events == [["status", '{"a": 1}'], ["status", "2"], ["message", "3"], ["message", "4"]]

    # --- a long trajectory: drawn a chunk at a time; the counts are the whole -------------
    n = 9_000  # loss mask 0 every third token: 6,000 sampled; token 1's logprob was -inf
    page.evaluate(
        """(n) => {
        const input_ids = [], loss_mask = [], logprobs = [];
        for (let i = 0; i < n; i++) {
            const mask = i % 3 === 0 ? 0 : 1;
            input_ids.push(i % 50); loss_mask.push(mask);
            logprobs.push(mask === 0 ? 0 : (i === 1 ? null : -0.1));
        }
        const trajectory = {turns: [{prompt_ids_delta: [], output_ids: input_ids,
                                     finish_reason: "length", sequence: 0}],
                            sequences: [], tokens: {input_ids, loss_mask, logprobs},
                            fidelity: null};
        document.getElementById("view-rollout").replaceChildren(Tokens.view(trajectory, new Map()));
    }""",
        n,
    )
    assert page.inner_text("#token-view .token-sampled") == "6,000"
    assert page.inner_text("#token-view .token-total") == "9,000"
    assert page.locator("#token-view .tokens .tok").count() == 4_000
    assert page.locator("#token-view .tokens .tok.m1").count() == 4_000 * 2 // 3
    inf = page.locator("#token-view .tokens .tok").nth(1)
    assert "logprob −∞" in (inf.get_attribute("title") or "")
    assert "dark" in (inf.get_attribute("class") or "")
    assert page.inner_text("#token-view .more-tokens") == "show 4,000 more tokens (5,000 not shown)"
    page.click("#token-view .more-tokens")
    assert page.locator("#token-view .tokens .tok").count() == 8_000
    page.click("#token-view .more-tokens")
    assert page.locator("#token-view .tokens .tok").count() == n
    assert page.locator("#token-view .tokens .tok.m1").count() == 6_000
    assert page.is_hidden("#token-view .more-tokens")

    # --- rollout A's answer arrives after B's: B stays on the page -------------------------
    shown = page.evaluate(
        """async ([a, b]) => {
        const original = apiGet;
        let release;
        const gate = new Promise((resolve) => { release = resolve; });
        window.apiGet = async (path, params) => {
            const answer = await original(path, params);
            if (path.includes(a)) await gate;  // A's answers come late
            return answer;
        };
        try {
            const slow = Rollout.show(a);
            await Rollout.show(b);
            const before = document.querySelector("#view-rollout h1").textContent;
            release();
            await slow;
            return [before, document.querySelector("#view-rollout h1").textContent];
        } finally {
            window.apiGet = original;
        }
    }""",
        [first, second],
    )
    assert shown == [f"results / {second}", f"results / {second}"]

    # --- a refresh of the unfiltered table lands after the filtered page: dropped ----------
    rows = page.evaluate("""async () => {
        const original = apiGet;
        let release;
        const gate = new Promise((resolve) => { release = resolve; });
        window.apiGet = async (path, params) => {
            const answer = await original(path, params);
            if (!params.status) await gate;  // the unfiltered page comes late
            return answer;
        };
        const ids = () => [...document.querySelectorAll(".result-row")].map((r) => r.dataset.id);
        try {
            const slow = Results.show(new URLSearchParams(""));
            await Results.show(new URLSearchParams("status=failed"));
            const before = ids();
            release();
            await slow;
            return [before, ids(), Results.loading];
        } finally {
            window.apiGet = original;
        }
    }""")
    assert rows == [failed, failed, False]

    # --- a count that stopped at its cap says so ----------------------------------------------
    page.evaluate("""() => Results.render({summaries: [], total: 10000, total_capped: true,
                                            next_before: null})""")
    assert page.inner_text("#results-total") == "10,000+ results match"

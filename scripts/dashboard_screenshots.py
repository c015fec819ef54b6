"""Make the docs' dashboard screenshots (docs/img/dashboard.png, docs/img/token-view.png).

A `rollserve serve` process with the fake vLLM and a scripted policy runs a small batch of
the bundled task sets (math, stem, and code with its hidden tests in bubblewrap); the
system's chromium (driven by Playwright) photographs the live view while the batch runs,
and the token view of a code rollout. Run from the repository root:

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/img] [--chromium PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from rollserve.agent.tool_calls import format_tool_call
from rollserve.testing import FakeVLLM

DATA = resources.files("rollserve") / "data"  # the bundled task sets
TOKEN = "screenshot-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def policy(prompt_ids: list[int], prompt: str) -> str:
    """Math: right on additions, off by one on the rest; stem: always C; code: writes
    the sum of two integers, runs it once, submits."""
    turn = prompt.count("<|im_start|>assistant") - 1
    if "# Sum of two integers" in prompt:
        if turn == 0:
            return "I will write the solution.\n" + format_tool_call(
                "str_replace_editor", {"command": "create", "path": "/workspace/solution.py",
                                       "file_text": SUM})
        if turn == 1:
            return format_tool_call("bash", {"command": "echo 2 3 | python3 solution.py"})
        return "The output is right.\n" + format_tool_call("submit", {})
    found = re.search(r"What is (\d+) ([+\-*]) (\d+)", prompt)
    if found:
        a, op, b = int(found[1]), found[2], int(found[3])
        value = a + b if op == "+" else (a - b + 1 if op == "-" else a * b + 1)
        return f"Computing {a} {op} {b} step by step gives \\boxed{{{value}}}."
    if "Answer:" in prompt:
        return "Thinking about the options, the answer is C.\nAnswer: C"
    return "The answer is \\boxed{0}."


def rows(name: str, count: int) -> list[dict]:
    lines = (DATA / name).read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def tasks() -> list[dict]:
    found = [{"data_source": "math", "instance": {k: v for k, v in r.items() if k != "task_id"},
              "n": 4} for r in rows("math_tasks.jsonl", 10)]
    found += [{"data_source": "stem", "instance": {k: v for k, v in r.items() if k != "task_id"},
               "n": 4} for r in rows("stem_tasks.jsonl", 6)]
    found += [{"data_source": "code", "instance": {k: v for k, v in r.items() if k != "task_id"},
               "n": 4} for r in rows("code_tasks.jsonl", 1)]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    llm = FakeVLLM("smollm2", replies=policy, latency=0.8).start_in_thread()
    state = Path(tempfile.mkdtemp(prefix="rollserve-shots-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", str(port), "--state-dir",
         str(state), "--backend", llm.url, "--api-token", TOKEN, "--run-workers", "6",
         "--log-level", "warning"], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium,
                                                 args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{url}/ui")
            page.fill("#token-input", TOKEN)
            page.click("#login-form button")
            page.wait_for_selector("#live-finished")
            body = {"tasks": tasks(), "sampling": {"max_tokens": 256}}
            r = httpx.post(f"{url}/v1/rollouts", json=body, headers=AUTH, timeout=60)
            r.raise_for_status()
            ids = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
            page.wait_for_timeout(12_000)  # the charts fill while the batch runs
            page.screenshot(path=str(args.out / "dashboard.png"))
            results = [httpx.get(f"{url}/v1/rollouts/{rid}", params={"wait": 120}, headers=AUTH,
                                 timeout=130).json()["result"] for rid in ids]
            code = next(r for r in results if r["data_source"] == "code")
            page.goto(f"{url}/ui/#rollout/{code['id']}")
            page.wait_for_selector("#token-view .tokens")
            # From the legend down to the first sampled turn: past the long system prompt.
            page.locator("#token-view .legend").scroll_into_view_if_needed()
            page.evaluate("""() => {
              const mark = document.querySelectorAll('#token-view .tokens .turn-mark')[1];
              window.scrollTo(0, mark.getBoundingClientRect().top + window.scrollY - 300);
            }""")
            page.screenshot(path=str(args.out / "token-view.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        llm.stop()
        shutil.rmtree(state, ignore_errors=True)
    for name in ("dashboard.png", "token-view.png"):
        print(args.out / name, (args.out / name).stat().st_size, "bytes")


if __name__ == "__main__":
    main()

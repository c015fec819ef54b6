"""The "Run one" example of docs/harnesses.md, run as written for each npm preset.

The block is read from the page (so an edit there is what runs), its ``PRESET`` set to
each of codex, claude-code, opencode, qwen-code and pi, and run against one
``rollserve serve`` (bubblewrap sandboxes, the harness install root of
tests/harness_install.py) whose policy is a scripted vLLM double answering ``42``. Each
of the two samples must complete with reward 1 through the real program; what the
block prints is checked too. A preset not installed is skipped (failed where
``ROLLSERVE_REQUIRE_HARNESSES=1``), as in the other real-harness tests.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.docs.snippets import ROOT, Snippet, snippets_of
from tests.e2e.conftest import ServerProcess
from tests.harness_install import harness_root, needs_harness

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

PAGE = ROOT / "docs" / "harnesses.md"
PRESETS = ["codex", "claude-code", "opencode", "qwen-code", "pi"]
DOCS_URL = "http://127.0.0.1:8000"
ASSIGNMENT = re.compile(r'^PRESET = "[a-z-]+"', re.MULTILINE)


def _example() -> Snippet:
    """The block this file is named on, on the page."""
    (block,) = [
        s
        for s in snippets_of(PAGE.read_text(), "docs/harnesses.md")
        if s.kind() == ("run", "tests/e2e/test_harness_docs_example_api.py")
    ]
    return block


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        env.delenv("ROLLSERVE_API_TOKEN", raising=False)
        fake = FakeVLLM("smollm2", replies=lambda ids, text: "42").start_in_thread()
        live = ServerProcess(
            tmp_path_factory.mktemp("harness-docs"), ["--backend", fake.url, "--harness-dir", str(harness_root())]
        )
        try:
            yield live.start(timeout=180)
        finally:
            live.stop()
            fake.stop()


def test_the_example_sets_one_preset_the_test_can_replace() -> None:
    code = _example().code
    assert len(ASSIGNMENT.findall(code)) == 1 and DOCS_URL in code


@pytest.mark.slow
@pytest.mark.parametrize("preset", [pytest.param(p, marks=needs_harness(p)) for p in PRESETS])
def test_the_docs_example_runs_each_preset_to_reward_1(
    preset: str, server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    code = ASSIGNMENT.sub(f'PRESET = "{preset}"', _example().code).replace(DOCS_URL, server.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"docs/harnesses.md ({preset})", "exec"), {"__name__": "__snippet__"})
    lines = printed.getvalue().splitlines()
    assert len(lines) == 2, printed.getvalue()
    for line in lines:
        name, status, reward, tokens = line.split()
        assert (name, status, float(reward)) == (preset, "completed", 1.0), (line, server.log.read_text()[-3000:])
        assert int(tokens) > 0

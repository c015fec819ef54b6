"""A harness whose first prompt cannot fit the rollout's context window is refused at
submit, through the HTTP API, with the numbers: the preset's measured first prompt
(``[prompt] first_tokens``) against the rollout's ``max_context_tokens`` or the
backend's window, whichever is smaller; never admitted to fail (masked) at its first
call. A preset without ``[prompt]`` is not checked; the bundled presets all declare
theirs."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rollserve.agent.harnesses.base import presets
from rollserve.engine.submit import FIRST_PROMPT_MARGIN
from rollserve.testing import FakeVLLM
from tests.harness_install import harness_root
from tests.waiting import eventually

PRESET = """name = "wordy"
summary = "a harness with a long system prompt (its command: the instance's)"
wire = "openai-chat"

[package]
kind = "none"

[run]
command = "exit 0"

[prompt]
harness_version = "1.2.3"
first_tokens = 3000
measured = { "SmolLM2-135M-Instruct" = 3100, "Qwen3" = 3000 }
"""


@pytest.fixture
def root():
    folder = Path(tempfile.mkdtemp(prefix="rollserve-harnesses-", dir="/tmp"))
    (folder / "presets").mkdir()
    (folder / "presets" / "wordy.toml").write_text(PRESET)
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def task(preset: str = "wordy", family: str = "gateway") -> dict:
    return {"data_source": family, "instance": {"answer": "42", "task": "Say 42.", "harness": {"preset": preset}}}


async def submit(client, agent: dict | None = None, preset: str = "wordy"):
    body: dict = {"tasks": [{"data_source": "math", "instance": {"question": "1+1?", "answer": "2"}}, task(preset)]}
    if agent is not None:
        body["agent"] = agent
    return await client.post("/v1/rollouts", json=body)


async def test_a_first_prompt_past_max_context_tokens_is_a_422_with_the_numbers(make_api, root):
    async with FakeVLLM("smollm2", latency=0.0) as llm:
        service, client = await make_api([llm.url], server={"harness_dir": root})
        r = await submit(client, {"max_context_tokens": 3000 + FIRST_PROMPT_MARGIN - 1})
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["field"] == "tasks[1].instance.harness.preset"
        message = error["message"]
        assert "wordy's first prompt is ~3,000 tokens" in message, message
        assert "3,100 with SmolLM2-135M-Instruct" in message
        assert "(wordy 1.2.3: " in message, message  # the version measured
        assert f"max_context_tokens is {3000 + FIRST_PROMPT_MARGIN - 1:,}" in message
        # Refused whole: nothing of the batch was stored or sent.
        assert service.engine.pending == 0
        assert llm.calls == [] and service.sandboxes.open_sandboxes() == []
        # One token more of window, and it is admitted.
        r = await submit(client, {"max_context_tokens": 3000 + FIRST_PROMPT_MARGIN})
        assert r.status_code == 202, r.text


async def test_the_family_default_counts_when_the_rollout_sets_none(make_api, root):
    async with FakeVLLM("smollm2", latency=0.0) as llm:
        _, client = await make_api([llm.url], server={"harness_dir": root})
        r = await client.post("/v1/rollouts", json={"tasks": [task()]})
        assert r.status_code == 202, r.text  # the gateway family's default: 8,192


async def test_the_backends_window_refuses_too_when_it_is_smaller(make_api, root):
    async with FakeVLLM("smollm2", latency=0.0, max_model_len=2048) as llm:
        service, client = await make_api([llm.url], server={"harness_dir": root})

        def known() -> int | None:
            session = service.router.session("probe")
            window = session.context_window()
            session.close()
            return window

        await eventually(known, what="the backend's window read at its health check")
        r = await submit(client)  # max_context_tokens: the family's 8,192
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["field"] == "tasks[1].instance.harness.preset"
        assert f"the policy's context window is {known():,}" in error["message"], error["message"]
        assert llm.calls == []


async def test_a_preset_without_a_measure_is_not_checked(make_api, root):
    toml = root / "presets" / "wordy.toml"
    toml.write_text(PRESET.split("[prompt]")[0])
    async with FakeVLLM("smollm2", latency=0.0) as llm:
        _, client = await make_api([llm.url], server={"harness_dir": root})
        r = await submit(client, {"max_context_tokens": 512})
        assert r.status_code == 202, r.text


def test_every_bundled_harness_declares_its_first_prompt():
    for name, preset in presets().items():
        if preset.package.kind == "none":
            continue  # the instance's own command: nothing to measure
        assert preset.prompt is not None, f"{name}: no [prompt]"
        assert preset.prompt.first_tokens == min(preset.prompt.measured.values()), name
        assert any("SmolLM2" in tokenizer for tokenizer in preset.prompt.measured), name


async def test_codex_on_a_4096_token_window_is_refused_at_submit(make_api):
    """The bundled codex preset as installed (skipped, saying what to install, when not):
    its ~5,400-token first prompt never fits 4,096."""
    if not (harness_root() / "codex" / "node_modules" / ".bin" / "codex").exists():
        pytest.skip(f"codex is not installed under {harness_root()} (rollserve harness install codex)")
    first = presets()["codex"].prompt
    assert first is not None
    async with FakeVLLM("smollm2", latency=0.0) as llm:
        _, client = await make_api([llm.url], server={"harness_dir": harness_root()})
        r = await submit(client, {"max_context_tokens": 4096}, preset="codex")
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["field"] == "tasks[1].instance.harness.preset"
        assert f"codex's first prompt is ~{first.first_tokens:,} tokens" in error["message"]
        assert "max_context_tokens is 4,096" in error["message"]

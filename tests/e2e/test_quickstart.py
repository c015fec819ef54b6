"""`rollserve quickstart` for real: the embedded SmolLM2 model, end to end."""

import importlib.util
import json
import subprocess
import sys

import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime

pytestmark = [
    pytest.mark.embedded,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="the embedded model needs the 'local' extra (llama-cpp-python)",
    ),
]


def test_quickstart_runs_real_rollouts_on_smollm2(tmp_path):
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollserve.cli",
            "quickstart",
            "--easy-tasks",
            "2",
            "--tasks",
            "2",
            "--code-tasks",
            "2",
            "--n",
            "2",
            "--max-tokens",
            "24",
            "--max-turns",
            "2",
            "--out",
            str(out),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quickstart results" in proc.stderr and "tokens/s" in proc.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    code = [r for r in results if r["data_source"] == "code"]
    if BubblewrapRuntime.unavailable_reason() is None:
        assert len(code) == 4  # a mixed batch: 2 easy (stem) + 2 math + 2 code tasks, n=2 each
    else:
        assert code == [] and "no code tasks" in proc.stderr
    assert len(results) == 8 + len(code)
    assert sorted(r["data_source"] for r in results if r["data_source"] != "code") == ["math"] * 4 + ["stem"] * 4
    # Each sample is a task of its own, with its own seed: rollout j samples with seed j.
    assert len({r["group_id"] for r in results}) == len(results)
    assert sorted(r["metadata"]["seed"] for r in results) == list(range(len(results)))
    assert "/ui" in proc.stderr
    for r in code:  # the small model seldom calls a tool; its episodes still end and are scored
        assert r["evaluation"]["reward_mode"] == "all" and r["evaluation"]["total"] > 0
        assert r["trajectory"]["messages"][0]["role"] == "system"
        assert "<tools>" in r["trajectory"]["messages"][0]["content"]
    for r in results:
        assert r["status"] == "completed", r["failure"]
        assert r["reward"] in (0.0, 1.0) and r["mask"] is False
        tokens = r["trajectory"]["tokens"]
        assert len(tokens["input_ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"])
        assert sum(tokens["loss_mask"]) == r["stats"]["output_tokens"] > 0
        assert all(t["backend"] == "embedded" for t in r["trajectory"]["turns"])
        sampled = [lp for lp, m in zip(tokens["logprobs"], tokens["loss_mask"]) if m]
        assert all(lp <= 0.0 for lp in sampled)
        # Sampled ids are kept even where re-tokenizing their text would differ
        # (a sampled, non-canonical split); the check reports it, nothing rewrites it.
        fidelity = r["trajectory"]["fidelity"]
        assert fidelity["append_only"] and fidelity["template_checked"]

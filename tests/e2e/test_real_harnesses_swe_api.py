"""Each npm preset's real harness (Codex, Claude Code, OpenCode, Qwen Code, Pi: the CLIs
from the npm registry, unmodified) solves a swe-mini instance through a real
``rollserve serve`` process: ``{"data_source": "swe", "instance": {..., "harness":
{"preset": NAME}}}``, the harness run by its preset in the rollout's bubblewrap sandbox,
its model calls through the gateway, the scripted vLLM double the policy.

The policy answers in Hermes ``<tool_call>`` blocks naming THAT harness's own shell tool
with its own argument names (the gateway turns them into the harness's wire's tool
calls: Responses function calls for Codex, Anthropic tool_use blocks for Claude Code,
Chat Completions tool calls for the others): "gold" applies the instance's gold patch
with a heredoc into ``git apply`` and shows ``git diff --stat``, then answers in text,
so the harness ends its loop and exits; "empty" answers in text at once. EVAL grades the
workspace's diff: gold resolves (reward 1), empty does not (0). Every sampled token of
the main loop is what the double logged for exactly that prompt; a harness's auxiliary
calls (OpenCode's session title) are in ``trajectory.auxiliary``, each exactly a logged
call, and in none of the main loop's sequences.

One server for the module; the ten rollouts go in one submit and run at once. A preset
that is not installed under ``$ROLLSERVE_HARNESS_DIR`` (``rollserve harness install
NAME``) is skipped, saying what to install.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.contract import RolloutResult
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.conftest import ServerProcess, calls_by_prompt, check_tokens
from tests.e2e.test_swe_api import BY_ID
from tests.harness_install import harness_problem, harness_root

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
]

# One swe-mini instance per preset (a repository each).
INSTANCE = {
    "codex": "rollserve-mini__datespan-1",
    "claude-code": "rollserve-mini__iniconf-2",
    "opencode": "rollserve-mini__moneyfmt-1",
    "qwen-code": "rollserve-mini__slugkit-3",
    "pi": "rollserve-mini__tablefmt-1",
}
# Each harness's own shell tool, with its own argument names.
SHELL = {
    "codex": lambda cmd: ("exec_command", {"cmd": cmd}),
    "claude-code": lambda cmd: ("Bash", {"command": cmd, "description": "Apply the fix"}),
    "opencode": lambda cmd: ("bash", {"command": cmd, "description": "Apply the fix"}),
    "qwen-code": lambda cmd: ("run_shell_command", {"command": cmd}),
    "pi": lambda cmd: ("bash", {"command": cmd}),
}
# The auxiliary calls each preset makes here (purpose, model asked), by its [calls] table.
AUXILIARY = {"opencode": [("title", "rollserve-policy-title")]}
TAG = re.compile(r"\[real:([a-z-]+):(gold|empty)\]")
TITLE_CALL = "You are a title generator"  # OpenCode's title call's system prompt
FINAL = "The fix is in place; nothing more to do."
STAT = "1 file changed"  # what `git diff --stat` says after the gold patch
WAIT = 420.0  # seconds: the bound on all ten rollouts (about 3 min on an idle machine)


def policy(prompt_ids: list[int], prompt: str) -> str:
    """By the task's tag: gold applies the patch with the harness's shell tool, then
    answers; empty answers at once. A title for OpenCode's title call."""
    if TITLE_CALL in prompt:
        return "Fixing the bug"
    preset, mode = TAG.findall(prompt)[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    if mode == "gold" and turn == 0:
        patch = BY_ID[INSTANCE[preset]]["patch"]
        command = f"git apply <<'ROLLSERVE_EOF'\n{patch}ROLLSERVE_EOF\ngit diff --stat"
        return "I will apply the fix.\n" + format_tool_call(*SHELL[preset](command))
    return FINAL


def task(preset: str, mode: str) -> dict:
    row = BY_ID[INSTANCE[preset]]
    return {
        "data_source": "swe",
        "id": f"{preset}:{mode}",
        "instance": {
            **row,
            "problem_statement": f"{row['problem_statement']}\n\n[real:{preset}:{mode}]",
            "harness": {"preset": preset},
        },
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[tuple[dict[str, dict], FakeVLLM]]:
    """The installed presets' ten rollouts, submitted at once to one server: (results by
    task id, the double)."""
    installed = [name for name in INSTANCE if harness_problem(name) is None]
    if not installed:
        pytest.skip("no npm harness is installed under " + str(harness_root()))
    llm = FakeVLLM("smollm2", replies=policy, latency=0.0).start_in_thread()
    server = ServerProcess(
        tmp_path_factory.mktemp("real-harnesses"),
        ["--backend", llm.url, "--harness-dir", str(harness_root()), "--init-workers", "10", "--eval-workers", "4"],
    )
    try:
        server.start()
        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=WAIT + 60) as client:
            tasks = [task(name, mode) for name in installed for mode in ("gold", "empty")]
            r = client.post(
                "/v1/rollouts",
                json={
                    "tasks": tasks,
                    "sampling": {"max_tokens": 4096},
                    "agent": {"max_turns": 8, "max_context_tokens": 65536},
                },
            )
            assert r.status_code == 202, r.text
            results = {}
            for group in r.json()["groups"]:
                (rid,) = group["rollout_ids"]
                left = max(1.0, WAIT - (time.monotonic() - started))
                view = client.get(f"/v1/rollouts/{rid}", params={"wait": left}).json()
                assert view["done"], (group["task_id"], view)
                results[group["task_id"]] = view["result"]
        print(f"\n{len(results)} real-harness swe rollouts in {time.monotonic() - started:.1f} s")
        yield results, llm
    finally:
        server.stop()
        llm.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["gold", "empty"])
@pytest.mark.parametrize("preset", list(INSTANCE))
def test_real_harness_solves_swe_mini_through_the_gateway(runs, preset, mode):
    if (problem := harness_problem(preset)) is not None:
        pytest.skip(f"harness {preset}: {problem}")
    results, llm = runs
    done = results[f"{preset}:{mode}"]
    evaluation = done["evaluation"] or {}
    log = evaluation.get("harness_log_tail")
    assert done["status"] == "completed" and not done["mask"], (done["failure"], log)
    assert evaluation["harness_exit_code"] == 0 and evaluation["finished"], log
    row = BY_ID[INSTANCE[preset]]
    if mode == "gold":
        assert done["reward"] == 1.0 and evaluation["resolved"], evaluation.get("log_tail", "")[-1500:]
        assert evaluation["git_patch"].strip() == row["patch"].strip()
    else:
        assert done["reward"] == 0.0 and not evaluation["resolved"]
        assert evaluation["git_patch"] == ""

    # The main loop: one append-only sequence, every sampled token what the double
    # answered to exactly that prompt; its calls are this task's logged calls.
    result = RolloutResult.model_validate(done)
    trajectory = result.trajectory
    assert trajectory.sequence_count == 1, [t.sequence for t in trajectory.turns]
    check_tokens(result, calls_by_prompt(llm))
    tag = f"[real:{preset}:{mode}]"
    mine = [
        c for c in llm.calls if tag in llm.tok.decode(c.prompt_ids) and TITLE_CALL not in llm.tok.decode(c.prompt_ids)
    ]
    assert [t.output_ids for t in trajectory.turns] == [c.output_ids for c in mine]
    names = [[call.name for call in t.tool_calls] for t in trajectory.turns]
    shell = SHELL[preset]("")[0]
    assert names == ([[shell], []] if mode == "gold" else [[]])
    if mode == "gold":  # the harness ran the command: its output came back to the policy
        assert STAT in llm.tok.decode(mine[-1].prompt_ids), log
    assert done["stats"]["gateway_calls"] == len(mine)

    # Auxiliary calls: recorded apart, each exactly a logged call, none in the main loop.
    auxiliary = trajectory.auxiliary
    assert [(a.purpose, a.model) for a in auxiliary] == AUXILIARY.get(preset, [])
    assert done["stats"]["auxiliary_calls"] == len(auxiliary)
    logged = {tuple(c.prompt_ids + c.output_ids): c.logprobs for c in llm.calls}
    for aux in auxiliary:
        assert logged[tuple(aux.tokens.input_ids)] == aux.turn.logprobs
        assert aux.tokens.loss_mask == [0] * len(aux.turn.prompt_ids_delta) + [1] * len(aux.turn.output_ids)
        assert aux.turn.output_ids not in [t.output_ids for t in trajectory.turns]
    assert TITLE_CALL not in llm.tok.decode(trajectory.tokens.input_ids)

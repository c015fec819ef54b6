"""The agent's bash tool through the HTTP API (code handler, bubblewrap sandbox, the
scripted vLLM double as the policy): a program waiting at a prompt is answered with
`is_input` on the next turn; a `timeout` the model passes interrupts the command and
frees the shell; the notice of a killed job shows in no later output."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.sandbox.helpers import processes_with

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"
TURNS = [
    ("bash", {"command": 'read -p "name? " who; echo hi $who'}),
    ("bash", {"command": "bob", "is_input": True}),
    ("bash", {"command": "cd /tmp && export KEEP=me; sleep 9876.5 &"}),
    ("bash", {"command": "kill %1"}),
    ("bash", {"command": "echo begin; sleep 987.25", "timeout": 1}),
    ("bash", {"command": "echo $KEEP; pwd"}),
    ("str_replace_editor", {"command": "create", "path": "/workspace/solution.py", "file_text": SOLUTION}),
    ("submit", {}),
]


def scripted_policy(prompt_ids: list[int], prompt: str) -> str:
    turn = prompt.count("<|im_start|>assistant") - 1
    name, args = TURNS[min(turn, len(TURNS) - 1)]
    return format_tool_call(name, args)


async def test_an_agent_drives_the_shell_through_the_api(make_api):
    async with FakeVLLM("smollm2", replies=scripted_policy, latency=0.01) as policy:
        service, client = await make_api([policy.url])
        task = {
            "data_source": "code",
            "instance": {
                "problem": "Read two integers from one line and print their sum.",
                "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}],
            },
        }
        r = await client.post("/v1/rollouts", json={"tasks": [task], "sampling": {"max_tokens": 256}})
        assert r.status_code == 202, r.text
        (rid,) = [i for group in r.json()["groups"] for i in group["rollout_ids"]]
        view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 120})).json()
    assert view["done"], view
    result = view["result"]
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    texts = [
        m["content"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
        for m in result["trajectory"]["messages"]
        if m["role"] == "tool"
    ]
    # The prompt came back (the handler's idle timeout is 30 s) and was answered.
    assert texts[0].startswith("name? \n[the command is waiting for input")
    assert texts[1] == "hi bob\n[exit code: 0]"
    assert texts[3] == "[exit code: 0]"  # `kill %1`: nothing else
    # The model's own timeout: interrupted (no tool error), the sleep gone.
    assert texts[4].startswith("begin\n[the command did not finish within 1 s]")
    assert texts[4].endswith("[exit code: 130]")
    # Same shell after all of it; the killed job's notice shows nowhere.
    assert texts[5] == "me\n/tmp\n[exit code: 0]"
    assert not any("Terminated" in text for text in texts)
    assert result["stats"]["tool_errors"] == 0 and result["reward"] == 1.0
    assert processes_with("987.25") == [] and processes_with("9876.5") == []

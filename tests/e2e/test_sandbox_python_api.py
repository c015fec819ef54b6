"""No sandbox sees the server's own packages, through the HTTP API (bubblewrap, the
scripted vLLM double as the policy): the python tool cannot import reasoning-gym to
rebuild its generated task and submit the entry's answer (reward 0), and the python
tool, the bash tool and the gateway forwarder's python all find every folder of the
server's packages empty (sandbox/server_python.py); the python tool still computes
with sympy (sandbox/sandbox_python.py)."""

from __future__ import annotations

import json
import os
import re

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.server_python import site_dirs
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import result as wait_result

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

SITES = [str(p) for p in site_dirs()]
PROBE = re.compile(r"PROBE (\{.*\})")

# What each server folder of packages holds, seen from inside (the start of every probe).
LOOK = f"""seen = {{}}
for folder in {SITES!r}:
    try:
        seen[folder] = len(os.listdir(folder))
    except OSError as error:
        seen[folder] = type(error).__name__
"""

# Inside the sandbox, on whatever python the tool runs: what each server folder of
# packages holds, and the attack: regenerate the task from its public seed.
EXPLOIT = f"""
import json, os
{LOOK}try:
    import reasoning_gym
    found = reasoning_gym.create_dataset("basic_arithmetic", seed=7780, size=500)[0]["answer"]
except ImportError as error:
    found = "ImportError: " + str(error)
import sympy
print("PROBE " + json.dumps({{"seen": seen, "found": found, "sympy": str(sympy.fibonacci(20))}}))
"""


def probe_in(prompt: str) -> dict | None:
    found = PROBE.findall(prompt)
    return json.loads(found[-1]) if found else None


def python_policy(prompt_ids: list[int], prompt: str) -> str:
    probe = probe_in(prompt)
    if probe is None:
        return format_tool_call("python", {"code": EXPLOIT})
    return format_tool_call("finish", {"answer": probe["found"]})


def assert_empty(seen: dict) -> None:
    """Every server folder of packages is empty or unreadable inside."""
    assert set(seen) == set(SITES)
    assert all(v == 0 or isinstance(v, str) for v in seen.values()), seen


# As root, sandboxes run as a uid of their own (the default) or as root (root_uids
# None: they then reach the server's interpreter under /root, as a non-root server's do).
UIDS = [{}] + ([{"root_uids": None}] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("options", UIDS, ids=lambda o: "root_uids=None" if o else "default")
async def test_the_python_tool_cannot_regenerate_its_task_from_the_seed(make_api, options):
    async with FakeVLLM("smollm2", replies=python_policy, latency=0.0) as llm:
        _, client = await make_api([llm.url], server={"sandbox_options": options})
        r = await client.post(
            "/v1/rollouts",
            json={
                "tasks": [
                    {
                        "data_source": "math_python",
                        "instance": {"dataset": "basic_arithmetic", "seed": 7780, "index": 0},
                    }
                ]
            },
        )
        assert r.status_code == 202, r.text
        (rid,) = r.json()["groups"][0]["rollout_ids"]
        done = await wait_result(client, rid)
    assert done["status"] == "completed" and not done["mask"], done["failure"]
    tool = [m["content"] for m in done["trajectory"]["messages"] if m["role"] == "tool"]
    probe = probe_in(tool[0])
    assert probe is not None, tool
    assert probe["sympy"] == "6765"  # the tool works, with the packages it needs
    assert probe["found"].startswith("ImportError: No module named 'reasoning_gym'"), probe
    assert_empty(probe["seen"])
    assert done["reward"] == 0.0


LIST = " ; ".join(f"echo {folder}=$(ls -A {folder} 2>/dev/null | wc -l)" for folder in SITES)


def bash_policy(prompt_ids: list[int], prompt: str) -> str:
    if "<tool_response>" not in prompt:
        return format_tool_call("bash", {"command": LIST + " ; python3 -c 'import reasoning_gym'"})
    return format_tool_call("submit", {})


async def test_the_bash_tool_sees_no_server_packages(make_api):
    async with FakeVLLM("smollm2", replies=bash_policy, latency=0.0) as llm:
        _, client = await make_api([llm.url])
        task = {"data_source": "code", "instance": {"problem": "Print 1.", "tests": [{"input": "", "output": "1\n"}]}}
        r = await client.post("/v1/rollouts", json={"tasks": [task], "sampling": {"max_tokens": 256}})
        assert r.status_code == 202, r.text
        (rid,) = r.json()["groups"][0]["rollout_ids"]
        done = await wait_result(client, rid)
    assert done["status"] == "completed" and not done["mask"], done["failure"]
    (text,) = [m["content"] for m in done["trajectory"]["messages"] if m["role"] == "tool"][:1]
    for folder in SITES:
        assert f"{folder}=0\n" in text, text
    assert "No module named 'reasoning_gym'" in text


HARNESS = f"""
import json, os, sys, urllib.request
{LOOK}try:
    import reasoning_gym
    found = "imported"
except ImportError as error:
    found = "ImportError: " + str(error)
print("PROBE " + json.dumps({{"seen": seen, "found": found, "path": sys.path}}))
body = json.dumps({{"model": "p", "messages": [{{"role": "user", "content": "[script:boxed] hi"}}]}})
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
                                 headers={{"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
urllib.request.urlopen(request, timeout=60).read()
"""


async def test_the_gateway_forwarders_python_sees_no_server_packages(make_api):
    from tests.e2e.test_gateway_api import policy

    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as llm:
        _, client = await make_api([llm.url])
        r = await client.post(
            "/v1/rollouts",
            json={
                "tasks": [
                    {
                        "data_source": "gateway",
                        "instance": {
                            "answer": "reply 0 of boxed",
                            "files": {"harness.py": HARNESS},
                            "command": '"$ROLLSERVE_PYTHON" harness.py',
                        },
                    }
                ],
                "sampling": {"max_tokens": 32},
            },
        )
        assert r.status_code == 202, r.text
        (rid,) = r.json()["groups"][0]["rollout_ids"]
        done = await wait_result(client, rid)
    evaluation = done["evaluation"]
    assert done["status"] == "completed", (done["failure"], evaluation)
    assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
    probe = probe_in(evaluation["harness_log_tail"])
    assert probe is not None, evaluation["harness_log_tail"]
    assert probe["found"].startswith("ImportError"), probe
    assert_empty(probe["seen"])
    assert not set(probe["path"]) & set(SITES)

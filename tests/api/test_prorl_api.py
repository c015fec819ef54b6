"""The ProRL-compatible API: NeMo Gym's prorl_agent client, replayed call for call,
and ProRL Agent Server's status codes (503 / 504 / 400) and job control.

The replay follows NVIDIA-NeMo/Gym responses_api_agents/prorl_agent: run_prorl.py's
``initialize_prorl_server`` (POST /start, a 400 meaning "already running", then POST
/add_llm_server {"address": "<model server>/v1"}) and ``call_prorl_process`` (POST
/process {"instance", "sampling_params", "job_id"}, ``raise_for_status``), then the
fields app.py's ``_run_with_prorl`` and ``convert_prorl_messages_to_output_items`` read.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rollserve.agent.tool_calls import SUBMIT_MARKERS, format_tool_call
from rollserve.agent.tool_env import ToolEnv, ToolEnvConfig
from rollserve.agent.tools import FinishTool
from rollserve.api.errors import render_model
from rollserve.api.prorl import NO_LLM_SERVER, NOT_RUNNING, STOPPED, ProRLConfig
from rollserve.api.prorl_result import prorl_result
from rollserve.contract import Failure, RolloutResult
from rollserve.contract.prorl import ProRLResult
from rollserve.handlers.base import AgentHandler, Evaluation, HandlerDefaults
from rollserve.handlers.episode import run_episode
from rollserve.testing import FakeVLLM
from tests.waiting import eventually

from ..agent.test_tool_formats import FakeBash

INSTANCE = {
    "instance_id": "math-2plus2",
    "trajectory_id": 0,
    "data_source": "math",
    "question": "What is 2 + 2?",
    "answer": "4",
}
# What _run_with_prorl sends: temperature, top_p and max_output_tokens, when set.
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_output_tokens": 48}


@pytest.fixture
def prorl_api(make_api):
    """``make_api`` (tests/conftest.py) with ProRL Agent's routes served."""

    async def make(config: ProRLConfig | None = None, backends=()):
        return await make_api(backends, prorl=config or ProRLConfig())

    return make


async def initialize_prorl_server(client, model_endpoint: str) -> None:
    """The client's start-up: /start (a 400 is fine: already running), /add_llm_server."""
    r = await client.post("/start")
    if r.status_code != 400:
        r.raise_for_status()
    r = await client.post("/add_llm_server", json={"address": model_endpoint})
    r.raise_for_status()


async def call_prorl_process(client, instance, sampling_params, job_id=None) -> dict:
    body = {"instance": instance, "sampling_params": sampling_params}
    if job_id is not None:
        body["job_id"] = job_id
    r = await client.post("/process", json=body)
    r.raise_for_status()
    return r.json()


def read_like_nemo_gym(result: dict) -> dict:
    """Every field _run_with_prorl and convert_prorl_messages_to_output_items read, with
    the same defaults, checked for the types they assume."""
    messages = result.get("messages") or []
    tools_raw = result.get("tools") or []
    assert isinstance(messages, list) and isinstance(tools_raw, list)
    assistants = []
    for item in messages:
        role = item.get("role", "")
        content = item.get("content", "") or ""
        assert role in ("system", "user", "developer", "assistant", "tool")
        assert isinstance(content, str)
        if role == "assistant":
            for call in item.get("tool_calls") or []:
                assert isinstance(call.get("name", ""), str)
                assert isinstance(call.get("arguments", ""), (str, dict))
            assistants.append(
                {
                    "text": content,
                    "generation_token_ids": item.get("token_ids") or [],
                    "prompt_token_ids": item.get("input_ids") or [],
                    "generation_log_probs": item.get("logprobs") or [],
                }
            )
    return {
        "assistants": assistants,
        "resolved": bool(result.get("resolved", False)),
        "success": bool(result.get("success", False)),
        "patch_exists": bool(result.get("git_patch")),
        "critical_error": result.get("critical_error"),
        "end_properly": result.get("end_properly", True),
        "filter": result.get("filter", False),
        "error": result.get("error"),
    }


# --- the replay -------------------------------------------------------------------------
async def test_replay_nemo_gym_prorl_agent(prorl_api, tok):
    replies = ["Let me think about it.", "2 + 2 = 4, so \\boxed{4}."]
    async with FakeVLLM(tok, replies=replies, latency=0.01) as fake:
        service, client = await prorl_api()
        await initialize_prorl_server(client, f"{fake.url}/v1")  # the model's OpenAI base URL
        await initialize_prorl_server(client, f"{fake.url}/v1")  # a restarted client: idempotent
        assert len(service.router.list()) == 1 and service.router.list()[0]["url"] == fake.url

        result = await call_prorl_process(
            client, INSTANCE, dict(SAMPLING, max_iterations=3), job_id=INSTANCE["instance_id"]
        )
        seen = read_like_nemo_gym(result)

    assert seen["resolved"] and seen["success"] and not seen["filter"]
    assert seen["critical_error"] is None and seen["error"] is None and seen["end_properly"]
    assert not seen["patch_exists"] and result["git_patch"] is None
    assert result["instance_id"] == "math-2plus2" and result["trajectory_id"] == 0
    assert result["finish"] is True and result["reward"] == 1.0 and result["tools"] == []
    assert set(result["timing"]) == {
        "init_time",
        "run_time",
        "eval_time",
        "others_time",
        "counted_elapsed",
        "timeout_triggered",
    }
    assert result["timing"]["run_time"] > 0 and result["timing"]["timeout_triggered"] is False
    assert [m["role"] for m in result["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    # Each assistant message: exactly what vLLM sampled, and the prompt it sampled from.
    assert len(seen["assistants"]) == len(fake.calls) == 2
    for message, call in zip(seen["assistants"], fake.calls):
        assert message["generation_token_ids"] == call.output_ids
        assert message["generation_log_probs"] == call.logprobs
        assert message["prompt_token_ids"] == call.prompt_ids
        assert call.request["max_tokens"] <= 48 and call.request["temperature"] == 1.0
    assert seen["assistants"][1]["text"] == replies[1]
    second = seen["assistants"][1]["prompt_token_ids"]
    assert second[: len(fake.calls[0].prompt_ids)] == fake.calls[0].prompt_ids  # append-only


async def test_process_before_start_and_without_an_llm_server_is_503(prorl_api):
    service, client = await prorl_api()
    body = {"instance": INSTANCE, "sampling_params": SAMPLING}
    r = await client.post("/process", json=body)
    assert r.status_code == 503 and r.json() == {"detail": NOT_RUNNING}
    for method, path in (("GET", "/status"), ("POST", "/stop")):
        assert (await client.request(method, path)).status_code == 503
    assert (await client.post("/cancel", json={"job_id": "x"})).status_code == 503
    # Buffered before /start, as ProRL does; cleared again.
    r = await client.post("/add_llm_server", json={"address": "http://127.0.0.1:9/v1"})
    assert r.status_code == 200 and r.json()["status"].startswith("Buffered")
    assert (await client.post("/clear_llm_server")).status_code == 200
    assert (await client.post("/start")).json() == {"status": "Server started successfully"}
    assert (await client.post("/start")).status_code == 400  # already running
    r = await client.post("/process", json=body)
    assert r.status_code == 503 and r.json() == {"detail": NO_LLM_SERVER}


async def test_bad_input_is_400(prorl_api, fake_llm):
    service, client = await prorl_api(backends=[fake_llm.url])
    await client.post("/start")
    # ProRL's default data_source is swebench (the swe handler): a math instance is not one.
    no_source = {k: v for k, v in INSTANCE.items() if k != "data_source"}
    r = await client.post("/process", json={"instance": no_source, "sampling_params": {}})
    assert r.status_code == 400 and "not a SWE-bench" in r.json()["detail"]
    r = await client.post("/process", json={"instance": {**INSTANCE, "data_source": "nope"}, "sampling_params": {}})
    assert r.status_code == 400 and "nope" in r.json()["detail"]
    r = await client.post("/process", json={"instance": INSTANCE, "sampling_params": {"temperature": -1}})
    assert r.status_code == 400 and "temperature" in r.json()["detail"]
    r = await client.post("/process", json={"instance": {"data_source": "math"}, "sampling_params": {}})
    assert r.status_code == 400 and "question" in r.json()["detail"]
    r = await client.post("/add_llm_server", json={"address": "not a url"})
    assert r.status_code == 400
    assert not fake_llm.calls and service.rollouts.status().in_flight == 0  # nothing started


async def test_a_job_past_its_wait_is_504_and_cancelled(prorl_api, tok):
    async with FakeVLLM(tok, replies=["\\boxed{4}"], latency=5.0) as fake:
        service, client = await prorl_api(ProRLConfig(http_timeout=0.3), backends=[fake.url])
        await client.post("/start")
        r = await client.post("/process", json={"instance": INSTANCE, "sampling_params": SAMPLING, "job_id": "slow"})
        assert r.status_code == 504 and r.json() == {"detail": "Processing timed out"}
        await eventually(
            lambda: service.rollouts.status().in_flight == 0,
            what="the timed-out job's rollout to be cancelled, not left running",
        )


async def test_a_timed_out_rollout_answers_critical_error_timeout(prorl_api, tok):
    async with FakeVLLM(tok, replies=["\\boxed{4}"], latency=3.0) as fake:
        service, client = await prorl_api(ProRLConfig(timeout=0.4), backends=[fake.url])
        await client.post("/start")
        result = await call_prorl_process(client, INSTANCE, SAMPLING, job_id="t")
    assert result["critical_error"] == "timeout" and result["filter"] is True
    assert result["resolved"] is False and result["success"] is False
    assert result["timing"]["timeout_triggered"] is True and "deadline" in result["error"]


async def test_cancel_status_and_stop(prorl_api, tok):
    async with FakeVLLM(tok, replies=["\\boxed{4}"], latency=3.0) as fake:
        service, client = await prorl_api(backends=[fake.url])
        await client.post("/start")
        body = {"instance": INSTANCE, "sampling_params": SAMPLING, "job_id": "group-1"}
        # NeMo Gym uses the instance id as job_id: a GRPO group shares one.
        group = [asyncio.create_task(client.post("/process", json=body)) for _ in range(2)]
        await eventually(lambda: len(fake.calls) >= 2, what="both jobs' LLM calls")
        status = (await client.get("/status")).json()
        assert status["status"] == "running" and status["pending_jobs"] == 2
        assert status["active_run"] == 2 and status["total"] >= 2
        assert {"init_queue", "run_queue", "eval_queue", "active_init", "active_eval"} <= set(status)
        r = await client.post("/cancel", json={"job_id": "group-1"})
        assert r.json() == {"status": "Cancel requested for job group-1"}
        for answer in await asyncio.gather(*group):
            result = answer.json()
            assert answer.status_code == 200
            assert result["critical_error"] == "timeout" and result["filter"] is True
            assert "cancelled" in result["error"] and result["job_id"] == "group-1"

        stopped = asyncio.create_task(client.post("/process", json={**body, "job_id": "j2"}))
        await eventually(lambda: len(fake.calls) >= 3, what="the third job's LLM call")
        assert (await client.post("/stop")).json() == {"status": "Server stopped successfully"}
        answer = await stopped
        # Never a 500 (ProRL's own server answers one here): a 409, the documented shape.
        assert answer.status_code == 409 and answer.json() == {"detail": STOPPED}
        assert (await client.post("/process", json=body)).status_code == 503
        assert (await client.post("/start")).status_code == 200


async def test_clear_llm_server_removes_every_backend(prorl_api, fake_llm):
    service, client = await prorl_api()
    await client.post("/start")
    for address in (f"{fake_llm.url}/v1", fake_llm.url, f"vllm={fake_llm.url}/v1/"):
        assert (await client.post("/add_llm_server", json={"address": address})).status_code == 200
    assert [b["url"] for b in service.router.list()] == [fake_llm.url]
    assert (await client.post("/clear_llm_server")).json() == {"status": "Cleared all LLM server addresses"}
    assert service.router.list() == []
    r = await client.post("/process", json={"instance": INSTANCE, "sampling_params": SAMPLING})
    assert r.status_code == 503


# --- the result mapping -------------------------------------------------------------------
def _result(trajectory: dict, **fields) -> RolloutResult:
    """A whole RolloutResult: ``trajectory``'s and ``fields``' keys over a plain one."""
    turns = trajectory.get("turns", [])
    ids = [i for t in turns for i in t["prompt_ids_delta"] + t["output_ids"]]
    mask = [m for t in turns for m in [0] * len(t["prompt_ids_delta"]) + [1] * len(t["output_ids"])]
    logprobs = [p for t in turns for p in [0.0] * len(t["prompt_ids_delta"]) + t["logprobs"]]
    return RolloutResult.model_validate(
        {
            "id": "g-1-0",
            "group_id": "g-1",
            "task_id": "g-1",
            "data_source": "math",
            "sample_index": 0,
            "status": "completed",
            "reward": 1.0,
            "evaluation": None,
            "failure": None,
            "mask": False,
            "mask_reason": None,
            "stale": False,
            "trajectory": {
                "messages": [],
                "turns": [],
                "fidelity": {},
                "policy_versions": [],
                "trainable": True,
                "ended_by": "finished",
                "tools": None,
                "tokens": {"input_ids": ids, "loss_mask": mask, "logprobs": logprobs},
                **trajectory,
            },
            "timing": {},
            "stats": {"turns": len(turns), "prompt_tokens": 0, "output_tokens": 0, "truncated_turns": 0},
            "attempt": 1,
            "metadata": {},
            **fields,
        }
    )


def _rendered(result: ProRLResult) -> dict:
    """As /process answers it: without the fields ProRL's result leaves out."""
    return json.loads(render_model(result, exclude_unset=True))


def test_tool_calls_come_from_the_turns_and_each_turn_gets_its_prompt():
    turns = [
        {
            "prompt_ids_delta": [1, 2, 3],
            "output_ids": [10, 11],
            "logprobs": [-0.1, -0.2],
            "finish_reason": "stop",
            "backend": "b",
            "policy_version": None,
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}, "id": None}],
        },
        {
            "prompt_ids_delta": [4, 5],
            "output_ids": [12],
            "logprobs": [-0.3],
            "finish_reason": "length",
            "backend": "b",
            "policy_version": None,
        },
    ]
    # The reply's text is not parsed again: the turn's parsed calls are what count.
    call = '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>'
    result = _result(
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "Looking." + call},
                {"role": "tool", "content": "a.txt", "name": "bash"},
                {"role": "assistant", "content": "Done"},
                {"role": "user", "content": "more?"},
            ],
            "turns": turns,
            "ended_by": "max_turns",
            "tools": [{"type": "function", "function": {"name": "bash"}}],
        },
        status="failed",
        reward=None,
        mask=True,
        mask_reason="infra",
        failure={"stage": "eval", "kind": "infra", "message": "scorer died"},
        timing={"init": 0.5, "run": 2.0, "total": 3.0},
    )
    out = prorl_result(result, {"instance_id": "i"}, "job")
    first, second = [m for m in out.messages if m.role == "assistant"]
    assert out.messages[-1] is second  # ends with the last assistant message, as ProRL's
    assert [c.model_dump() for c in first.tool_calls] == [{"name": "bash", "arguments": {"command": "ls"}}]
    assert first.input_ids == [1, 2, 3] and first.token_ids == [10, 11]
    assert second.input_ids == [1, 2, 3, 10, 11, 4, 5] and second.logprobs == [-0.3]
    assert out.critical_error == "eval" and out.filter and out.error == "scorer died"
    assert out.end_properly is False  # the last turn was cut by max_tokens
    assert out.tools == result.trajectory.tools
    assert out.timing.others_time == pytest.approx(0.5)
    assert out.timing.counted_elapsed == pytest.approx(2.5)
    rendered = _rendered(out)
    assert "tool_calls" not in rendered["messages"][-1]  # keys only where ProRL has them
    assert rendered["messages"][3] == {"role": "tool", "content": "a.txt", "name": "bash"}
    assert set(rendered["messages"][2]) == {"role", "content", "tool_calls", "token_ids", "input_ids", "logprobs"}
    # An agent failure is trained on: no critical_error, not filtered.
    agent = result.model_copy(update={"mask": False, "failure": Failure(stage="run", kind="agent", message="bad call")})
    assert prorl_result(agent, {}).critical_error is None and not prorl_result(agent, {}).filter


def test_a_message_level_trajectory_has_no_ids():
    result = _result(
        {
            "messages": [
                {"role": "user", "content": "u"},
                {
                    "role": "assistant",
                    "content": "a",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
            ],
            "turns": [
                {
                    "prompt_ids_delta": [],
                    "output_ids": [],
                    "logprobs": [],
                    "finish_reason": "tool_calls",
                    "backend": "api",
                    "tool_calls": [{"name": "f", "arguments": "{}", "id": "c1"}],
                }
            ],
            "trainable": False,
        }
    )
    (assistant,) = [m for m in _rendered(prorl_result(result, {}))["messages"] if m["role"] == "assistant"]
    assert assistant["token_ids"] is None and assistant["input_ids"] is None
    assert assistant["tool_calls"] == [{"name": "f", "arguments": "{}"}]


class BashBlockTask(AgentHandler):
    """A task family whose agent calls its tools in bash_block format (one ```bash block
    per reply), with a stand-in shell: what is under test is /process, not the shell."""

    name = "bash-block-task"
    defaults = HandlerDefaults(max_turns=4)

    def validate(self, instance: dict) -> None:
        pass

    async def init(self, rollout) -> None:
        pass

    async def run(self, rollout) -> None:
        env = ToolEnv(
            [FakeBash(), FinishTool()],
            "Say hi, then submit 42.",
            tokenizer=self.ctx.tokenizer,
            config=ToolEnvConfig(tool_format="bash_block"),
        )
        await run_episode(self.ctx, rollout, env)

    async def eval(self, rollout) -> Evaluation:
        return Evaluation(reward=1.0)

    async def cleanup(self, rollout) -> None:
        pass


async def test_an_episode_in_bash_block_format_reports_its_tool_calls(prorl_api, tok):
    """/process names each call of a bash_block episode: from the turns, where the
    environment recorded what it parsed, not by parsing the text again as hermes."""
    replies = [
        "I will greet.\n" + format_tool_call("bash", {"command": "echo hi"}, "bash_block"),
        f"```bash\necho {SUBMIT_MARKERS[0]}\necho 42\n```",
    ]
    async with FakeVLLM(tok, replies=replies, latency=0.0) as fake:
        service, client = await prorl_api(backends=[fake.url])
        service.handlers.register(BashBlockTask.name, BashBlockTask)
        await client.post("/start")
        result = await call_prorl_process(client, {"data_source": BashBlockTask.name}, {"max_output_tokens": 64})
    assert result["finish"] is True and result["critical_error"] is None, result
    calls = [(m["role"], m.get("tool_calls")) for m in result["messages"] if m["role"] == "assistant"]
    assert calls == [
        ("assistant", [{"name": "bash", "arguments": {"command": "echo hi"}}]),
        ("assistant", [{"name": "bash", "arguments": {"command": f"echo {SUBMIT_MARKERS[0]}\necho 42"}}]),
    ]
    ProRLResult.model_validate(result)  # the answer is the published shape


def test_serve_prorl_listens_on_8006(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from rollserve.api import serving
    from rollserve.cli import app

    seen = {}
    monkeypatch.setattr(serving, "serve", lambda app, service, **kw: seen.update(app=app, **kw))
    result = CliRunner().invoke(app, ["serve", "--prorl", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    paths = set(seen["app"].openapi()["paths"])
    assert seen["port"] == 8006 and {"/start", "/process", "/add_llm_server"} <= paths
    CliRunner().invoke(app, ["serve", "--state-dir", str(tmp_path)])
    assert seen["port"] == 8000 and "/process" not in seen["app"].openapi()["paths"]


@pytest.mark.vllm
async def test_replay_against_a_real_vllm(prorl_api, vllm_url):
    url = vllm_url
    service, client = await prorl_api()
    await initialize_prorl_server(client, f"{url}/v1")
    result = await call_prorl_process(
        client, INSTANCE, {"temperature": 0.0, "max_output_tokens": 16, "max_iterations": 1}, job_id="real"
    )
    (assistant,) = read_like_nemo_gym(result)["assistants"]
    assert result["critical_error"] is None and not result["filter"]
    assert 0 < len(assistant["generation_token_ids"]) == len(assistant["generation_log_probs"]) <= 16
    system_user = [{"role": m["role"], "content": m["content"]} for m in result["messages"][:2]]
    async with httpx.AsyncClient(base_url=url) as vllm:  # the template side, as vLLM renders it
        r = await vllm.post("/tokenize", json={"messages": system_user, "add_generation_prompt": True})
    assert assistant["prompt_token_ids"] == r.json()["tokens"]


async def test_add_llm_server_refuses_a_server_that_cannot_serve_the_adapter_with_a_400(prorl_api, tok, tmp_path):
    """After a LoRA sync, ProRL's /add_llm_server refuses (400, ProRL's one refusal code,
    not the native route's 409) a server that cannot serve the adapter: it would sample
    the base model under the new policy version. Nothing is registered."""
    from rollserve.client.weights import AsyncWeightSync, LoRA
    from rollserve.testing.fake_llamacpp import FakeLlamaCpp

    from .test_weight_sync_api import adapter, rollserve_client

    async with FakeVLLM(tok, runtime_lora=True, dev_mode=True) as fake, FakeLlamaCpp(tok) as llama:
        service, client = await prorl_api(backends=[fake.url])
        await client.post("/start")
        native = rollserve_client(service)
        await AsyncWeightSync(native).update(LoRA("policy", adapter(tmp_path)), policy_version=2)
        await native.aclose()
        r = await client.post("/add_llm_server", json={"address": f"llamacpp={llama.url}"})
        assert r.status_code == 400
        assert r.json()["detail"].startswith("Failed to add LLM server: ")
        assert "cannot serve the LoRA adapter 'policy'" in r.json()["detail"]
        assert [b["url"] for b in service.router.list()] == [fake.url]

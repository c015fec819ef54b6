"""rollserve.integrations.verl in verl 0.9's own rollout path, against a live rollserve
and a scripted fake vLLM.

A venv with ``rollserve[verl]`` (the client and verl, CPU torch; ``-c
constraints-verl.txt``) is built once and kept under the rollserve cache
(``verl_env.py``; CI builds it in the background while other tests run). rollserve
itself is reinstalled into it from this checkout on each run (``--no-deps``: seconds).
There ``verl_driver.py`` runs verl's ``AgentLoopWorker.generate_sequences`` on a parquet
dataset of rollserve rows, as verl's PPO trainer does, and prints verl's batch; this
checks it token for token against what rollserve stored.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
from pathlib import Path

import pytest

from rollserve.client import Client
from rollserve.contract import RolloutResult
from rollserve.integrations.verl_rows import verl_row
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from tests.integrations import verl_env

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("verl_driver.py")
DRIVER_TIMEOUT_S = 600
PROMPT_LENGTH, RESPONSE_LENGTH = 256, 192

# The first test builds the venv when it is not cached (pytest-timeout's default is 300 s).
pytestmark = pytest.mark.timeout(verl_env.BUILD_TIMEOUT_S + verl_env.REINSTALL_TIMEOUT_S + DRIVER_TIMEOUT_S + 600)

TWO = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
THREE = {
    "data_source": "math",
    "instance": {"question": "What is 1 + 2?", "answer": "3"},
    "agent": {"max_turns": 3},
    "metadata": {"row": 7},
}
# The second turn of these never comes back (always; the first time only): RUN times out.
STALL = {"data_source": "math", "instance": {"question": "What is 5 + 5?", "answer": "10"}, "timeouts": {"run": 3}}
STALL_ONCE = {"data_source": "math", "instance": {"question": "What is 6 + 6?", "answer": "12"}, "timeouts": {"run": 3}}


@pytest.fixture(scope="session")
def verl_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cached venv with ``rollserve[verl]`` (``verl_env.ensure``: built once, or
    waited for while CI builds it in the background), this checkout's rollserve in it."""
    source = verl_env.source_copy(tmp_path_factory.mktemp("verl"))
    env_dir = verl_env.ensure(source)
    verl_env.pip(
        env_dir / "bin" / "python", "--no-deps", "--force-reinstall", str(source), timeout=verl_env.REINSTALL_TIMEOUT_S
    )
    return env_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What verl reads of a model: the fake vLLM's tokenizer (SmolLM2's, with its chat
    template) and a config.json (verl needs no weights to roll out)."""
    path = tmp_path_factory.mktemp("model")
    tok = ChatTokenizer.load("smollm2")
    tok.hf.save_pretrained(str(path))
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": len(tok.hf),
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "max_position_embeddings": 2048,
                "bos_token_id": tok.hf.bos_token_id,
                "eos_token_id": tok.eos_token_id,
            }
        )
    )
    return path


def test_verl_and_the_client_share_one_venv(verl_venv: Path) -> None:
    python = str(verl_venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = (
        "import importlib.metadata as m, rollserve, verl; "
        "print(m.version('verl'), m.version('transformers'), rollserve.__file__)"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, cwd=verl_venv)
    assert done.returncode == 0, done.stderr[-4000:]
    verl_version, transformers_version, location = done.stdout.split()
    assert verl_version.startswith("0.9.") and transformers_version < "5.11"
    assert location.startswith(str(verl_venv))  # the installed package, not this checkout
    # the client side only: none of the server's packages came with it
    for name in ("llama_cpp", "reasoning_gym", "rollserve.server"):
        done = subprocess.run([python, "-c", f"import {name}"], capture_output=True, timeout=300, cwd=verl_venv)
        assert done.returncode != 0, name


def two_turns(prompt_ids: list[int], text: str) -> str:
    """A reply without an answer, then the answer (4 for TWO; wrong for the rest)."""
    return "So the answer is \\boxed{4}." if "four" in text else "I think it is four."


def _float32(value: float) -> float:
    """``value`` as verl holds it (``rollout_log_probs`` is a float32 tensor)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _stored(client: Client, rollout_id: str) -> RolloutResult:
    view = client.rollout(rollout_id)
    assert view.result is not None
    return view.result


def _check_exact(sample: dict, result: RolloutResult) -> None:
    """verl's batch row is rollserve's trajectory, token for token."""
    tokens, turns = result.trajectory.tokens, result.trajectory.turns
    cut = len(turns[0].prompt_ids_delta)
    assert sample["prompt_ids"] == turns[0].prompt_ids_delta == tokens.input_ids[:cut]
    assert sample["prompt_ids"] + sample["response_ids"] == tokens.input_ids
    assert sample["response_mask"] == tokens.loss_mask[cut:]
    assert sample["rollout_log_probs"] == [_float32(x) for x in tokens.logprobs[cut:]]
    assert sum(sample["response_mask"]) == sum(len(turn.output_ids) for turn in turns)
    assert sample["num_turns"] == len(result.trajectory.messages)
    # the reward on the last response token, nowhere else
    scores = sample["rm_scores"]
    last = len(sample["response_ids"]) - 1
    assert scores[last] == _float32(result.reward or 0.0)
    assert scores[:last] + scores[last + 1 :] == [0.0] * (len(scores) - 1)


def _drive(verl_venv: Path, tmp_path: Path, spec: dict) -> dict:
    """Run verl_driver.py in the verl venv; what it printed."""
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [str(verl_venv / "bin" / "python"), str(DRIVER), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_AUTH_MODE": "disabled",
        },
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_verls_rollout_gets_rollserves_tokens_exactly(
    verl_venv: Path, model_dir: Path, server_factory, fake_llm_thread, tmp_path: Path
) -> None:
    stalled_once: list[bool] = []

    async def reply(prompt_ids: list[int], text: str) -> str:
        if "four" in text and ("5 + 5" in text or ("6 + 6" in text and not stalled_once)):
            if "6 + 6" in text:
                stalled_once.append(True)
            await asyncio.sleep(120)
        return two_turns(prompt_ids, text)

    fake = fake_llm_thread(replies=reply)
    server = server_factory("--backend", fake.url).start(timeout=180)
    rows = [
        verl_row(TWO, 0),
        verl_row(THREE, 1),
        verl_row(STALL, 2),
        verl_row(STALL_ONCE, 3, agent_name="rollserve_retry"),
    ]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    loop = {
        "_target_": "rollserve.integrations.verl.RollserveAgentLoop",
        "url": server.url,
        "timeout": 300,
        "sampling": {"max_tokens": 64},
    }
    (tmp_path / "loops.yaml").write_text(
        json.dumps(
            [  # JSON is YAML
                {"name": "rollserve", **loop, "masked_retries": 0},
                {"name": "rollserve_retry", **loop, "masked_retries": 1},
            ]
        )
    )
    spec = {
        "model_dir": str(model_dir),
        "rows": str(tmp_path / "rows.json"),
        "loop_config": str(tmp_path / "loops.yaml"),
        "n": 2,
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "validate": False,
    }
    out = _drive(verl_venv, tmp_path, spec)
    samples = out["samples"]
    assert len(samples) == 8
    for sample in samples:
        assert sample["shapes"] == {"prompts": [8, PROMPT_LENGTH], "responses": [8, RESPONSE_LENGTH]}
    # verl's n samples of a prompt: one uid, each its own rollserve group of one
    uids = [sample["uid"] for sample in samples]
    assert uids[0] == uids[1] != uids[2] == uids[3] != uids[4] == uids[5] != uids[6] == uids[7]
    assert len({sample["rollserve"]["group_id"] for sample in samples[:4]}) == 4
    with Client(server.url) as client:
        for sample in samples[:4]:  # TWO and THREE: scored, trained on
            result = _stored(client, sample["rollserve"]["id"])
            assert not result.mask and sample["rollserve_masked"] == 0.0
            assert sample["rollserve"]["metadata"] == result.metadata
            _check_exact(sample, result)
        assert [sample["rm_scores"][len(sample["response_ids"]) - 1] for sample in samples[:4]] == [1.0, 1.0, 0.0, 0.0]
        for sample in samples[4:6]:  # STALL: masked, nothing of it trained on
            result = _stored(client, sample["rollserve"]["id"])
            assert result.mask and result.reward is None
            assert sample["rollserve_masked"] == 1.0 and sample["rollserve"]["attempts"] == 1
            assert sample["prompt_ids"] + sample["response_ids"] == result.trajectory.tokens.input_ids
            # the policy did sample tokens (its first turn), and none of them is trained on
            assert sum(result.trajectory.tokens.loss_mask) > 0
            assert sample["response_mask"] == [0] * len(sample["response_ids"])
            assert sample["rm_scores"] == [0.0] * RESPONSE_LENGTH
        # STALL_ONCE: the masked sample was asked again, fresh, and that one is used
        attempts = sorted(sample["rollserve"]["attempts"] for sample in samples[6:])
        assert attempts == [1, 2]
        for sample in samples[6:]:
            group_ids = sample["rollserve"]["group_ids"]
            if len(group_ids) == 2:
                first = client.group(group_ids[0]).rollouts[0].result
                assert first is not None and first.mask
            result = _stored(client, sample["rollserve"]["id"])
            assert not result.mask and sample["rollserve_masked"] == 0.0
            _check_exact(sample, result)
    # rollserve's stage timings: verl's agent loop metrics, and all of them per sample
    assert len(out["metrics"]) == 8
    for metrics, sample in zip(out["metrics"], samples):
        timing = sample["rollserve"]["timing"]
        assert timing["total"] > 0 and timing["run"] > 0
        assert metrics["generate_sequences"] == timing.get("llm", timing["run"])
        assert metrics["compute_score"] == timing["eval"]
    assert set(out["reward_extra_keys"]) == {"rollserve_masked", "rollserve_attempts"}


def test_verls_own_servers_are_registered_and_sampled_from(
    verl_venv: Path, model_dir: Path, server_factory, fake_llm_thread, tmp_path: Path
) -> None:
    """``backends: verl``: rollserve starts with no backend; the loop reads verl's server
    addresses from verl's load balancer and registers them; the samples come from there."""
    fake = fake_llm_thread(replies=two_turns)
    server = server_factory().start(timeout=180)
    address = fake.url.removeprefix("http://").rstrip("/")
    (tmp_path / "rows.json").write_text(json.dumps([verl_row(TWO, 0)]))
    (tmp_path / "loops.yaml").write_text(
        json.dumps(
            [
                {
                    "name": "rollserve",
                    "_target_": "rollserve.integrations.verl.RollserveAgentLoop",
                    "url": server.url,
                    "timeout": 300,
                    "backends": "verl",
                    "sampling": {"max_tokens": 64},
                }
            ]
        )
    )
    with Client(server.url) as client:
        assert client.list_backends().backends == []
        out = _drive(
            verl_venv,
            tmp_path,
            {
                "model_dir": str(model_dir),
                "rows": str(tmp_path / "rows.json"),
                "loop_config": str(tmp_path / "loops.yaml"),
                "n": 2,
                "prompt_length": PROMPT_LENGTH,
                "response_length": RESPONSE_LENGTH,
                "validate": False,
                "verl_servers": [address],
            },
        )
        backends = client.list_backends().backends
        name = "verl-" + address.replace(":", "-")
        assert [(b.name, b.kind, b.url.rstrip("/")) for b in backends] == [(name, "vllm", fake.url.rstrip("/"))]
        assert len(out["samples"]) == 2 and fake.calls
        for sample in out["samples"]:
            result = _stored(client, sample["rollserve"]["id"])
            assert not result.mask and {turn.backend for turn in result.trajectory.turns} == {name}
            _check_exact(sample, result)

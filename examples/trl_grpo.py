"""A real GRPO run: TRL's GRPOTrainer trains a LoRA adapter of SmolLM2-135M-Instruct on
rollouts that rollserve samples from a real vLLM server, and every optimizer step's
adapter is pushed into that vLLM before the next rollouts.

    python examples/trl_grpo.py --vllm http://127.0.0.1:8011        # starts rollserve itself
    python examples/trl_grpo.py --rollserve http://127.0.0.1:8000   # a running rollserve

The vLLM server must serve SmolLM2 with runtime LoRA loading, in dev mode (rollserve
resets its prefix cache after each load: ``VLLM_SERVER_DEV_MODE=1``;
``ROLLSERVE_VLLM_LORA=1 scripts/vllm_cpu/start.sh`` serves both) and read adapters from this
machine's disk. ``--model`` is the fp32 model folder that server serves (start.sh's
``~/.cache/rollserve/vllm-cpu/smollm2``): the trainer and vLLM start from the same weights.

The loop:

1. a version-0 adapter (LoRA B = 0: the base model's outputs) is loaded before the first
   rollout, so every request of the run names the adapter;
2. step k: ``rollout_func`` submits the step's prompts to rollserve (``n`` =
   ``num_generations``), rollserve's own reward (``math``: the boxed answer checked by
   math-verify) scores them, TRL takes one optimizer step;
3. after step k the adapter is saved to a folder of its own (``adapters/v<k+1>``: vLLM's
   prefix cache keys on the adapter's path, so a reused path could serve stale KV) and
   ``WeightSync`` pauses rollserve, loads it in place, and resumes at policy version k+1.

It measures, per step, and prints as a table and writes as JSON (``--json``): the
train-inference mismatch (the trainer's own fp32 logprobs of the sampled tokens under
the adapter that sampled them, against rollserve's logprobs), the same against the
previous version's adapter (larger when the sync reached vLLM), the policy versions
the rollouts carry, the loss, the adapter's change, and whether the completion ids
equal rollserve's stored tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch

from rollserve.client import Client
from rollserve.client.weights import LoRA, WeightSync
from rollserve.contract import AgentLimits, SamplingParams
from rollserve.integrations.trl import RolloutOutput, Trainer, rollout_func, rollserve_reward, task_prompt

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = Path(os.environ.get("ROLLSERVE_VLLM_HOME",
                                    Path.home() / ".cache/rollserve/vllm-cpu")) / "smollm2"
DEFAULT_DATA = HERE / "data" / "science_ab.jsonl"


@dataclass
class RunConfig:
    """One run's settings (the command line's options)."""

    model: Path = DEFAULT_MODEL
    data: Path = DEFAULT_DATA
    out: Path = Path("trl_grpo_out")
    rollserve: str | None = None  # a running rollserve; None: start one on ``vllm``
    vllm: str = "http://127.0.0.1:8011"
    steps: int = 3
    prompts_per_step: int = 3
    num_generations: int = 6
    max_tokens: int = 10
    learning_rate: float = 2e-3
    lora_rank: int = 8
    adapter_name: str = "trl-grpo"
    seed: int = 0
    timeout: float = 900.0  # each step's rollouts, each weight sync
    compare_previous: bool = True  # also measure against the previous version's adapter


@dataclass
class StepRecord:
    """What one optimizer step measured (step k: rollouts sampled by version k)."""

    step: int
    samples: int = 0
    masked: int = 0
    tokens: int = 0  # sampled tokens compared (loss_mask 1)
    mean_abs_delta: float = math.nan
    max_abs_delta: float = math.nan
    mean_ratio: float = math.nan
    old_mean_abs_delta: float | None = None  # against version k-1 (None at step 0)
    old_max_abs_delta: float | None = None
    policy_versions: list[int] = field(default_factory=list)
    reward_mean: float = math.nan
    groups_with_spread: int = 0  # groups whose rewards differ (nonzero advantages)
    tokens_match: bool = False  # completion ids == rollserve's stored tokens
    loss: float | None = None
    adapter_change: float | None = None  # L2 norm of this step's change to the adapter
    rollout_s: float = math.nan  # rollserve's rollouts of this step
    measure_s: float = math.nan  # the trainer's recomputations above
    sync_s: float | None = None  # pause, load the new adapter into vLLM, resume
    step_s: float | None = None  # rollouts to the end of the sync


# --- rollserve ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when this process dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def rollserve_service(config: RunConfig, log_dir: Path) -> Iterator[str]:
    """A rollserve URL: ``config.rollserve``, or a ``rollserve serve`` started here on
    ``config.vllm`` (its own process group, ended on exit or when this process dies;
    waits at most 180 s for it to answer)."""
    if config.rollserve:
        yield config.rollserve
        return
    port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "rollserve.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollserve", "serve", "--port", str(port), "--backend",
             config.vllm, "--state-dir", str(log_dir / "state")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rollserve exited ({proc.returncode}); see {log_dir / 'rollserve.log'}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollserve did not answer within 180 s; see {log_dir / 'rollserve.log'}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# --- what is measured -----------------------------------------------------------------
def logprobs_of(model: torch.nn.Module, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
    """For each (ids, start): the model's logprob of each of ``ids[start:]`` given what
    precedes it. One right-padded fp32 batch; logits only where a completion is."""
    width = max(len(ids) for ids, _ in sequences)
    x = torch.zeros((len(sequences), width), dtype=torch.long)
    attention = torch.zeros_like(x)
    for row, (ids, _) in enumerate(sequences):
        x[row, :len(ids)] = torch.tensor(ids)
        attention[row, :len(ids)] = 1
    first = min(start for _, start in sequences) - 1  # the first position whose logits matter
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        logits = model(input_ids=x, attention_mask=attention,
                       logits_to_keep=torch.arange(first, width - 1)).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, x[:, first + 1:, None])[..., 0]
    return [[float(v) for v in logprobs[row, start - 1 - first:len(ids) - 1 - first]]
            for row, (ids, start) in enumerate(sequences)]


class Mismatch:
    """Per sampled token: Δ = trainer logprob - rollserve logprob."""

    def __init__(self) -> None:
        self.deltas: list[float] = []

    def add(self, trainer: list[float], sampled: list[float], keep: list[int]) -> None:
        self.deltas.extend(trainer[j] - sampled[j] for j in keep)

    def summary(self) -> tuple[float, float, float]:
        """mean |Δ|, max |Δ|, mean importance ratio exp(Δ)."""
        if not self.deltas:
            return math.nan, math.nan, math.nan
        n = len(self.deltas)
        return (sum(abs(d) for d in self.deltas) / n, max(abs(d) for d in self.deltas),
                sum(math.exp(d) for d in self.deltas) / n)


class Adapter:
    """The LoRA weights of each policy version: saved to ``folder/v<k>`` for vLLM, kept in
    memory to measure against and to diff."""

    def __init__(self, model: torch.nn.Module, folder: Path) -> None:
        self.model = model
        self.folder = folder
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def params(self) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in self.model.named_parameters() if "lora_" in name}

    def save(self, version: int) -> str:
        self.versions[version] = {name: p.detach().clone() for name, p in self.params().items()}
        path = self.folder / f"v{version}"
        self.model.save_pretrained(path)
        return str(path)

    def change(self, version: int) -> float:
        """L2 norm of the current weights minus version ``version - 1``'s."""
        before = self.versions[version - 1]
        return math.sqrt(sum(float(((p.detach() - before[name]) ** 2).sum())
                             for name, p in self.params().items()))

    @contextlib.contextmanager
    def swapped(self, version: int) -> Iterator[None]:
        """The model with version ``version``'s LoRA weights, then its own again."""
        params = self.params()
        current = {name: p.detach().clone() for name, p in params.items()}
        try:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(self.versions[version][name])
            yield
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(current[name])


# --- the run --------------------------------------------------------------------------
def load_rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(config: RunConfig, on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
    """Train ``config.steps`` optimizer steps; one record per step."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from datasets import Dataset

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(config.seed)
    out = config.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    base = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(
        r=config.lora_rank, lora_alpha=2 * config.lora_rank, lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    adapter = Adapter(model, out / "adapters")
    records: list[StepRecord] = []
    starts: list[float] = []

    with rollserve_service(config, out) as url, Client(url, timeout=60) as client:
        sync = WeightSync(client, pause_timeout=config.timeout, load_timeout=config.timeout)
        sync.update(LoRA(config.adapter_name, adapter.save(0)), policy_version=0)
        inner = rollout_func(client, sampling=SamplingParams(temperature=1.0, max_tokens=config.max_tokens),
                             agent=AgentLimits(max_turns=1), timeout=config.timeout)

        def rollout(prompts: list[str], trainer: Trainer) -> RolloutOutput:
            began = time.monotonic()
            starts.append(began)
            output = inner(prompts, trainer)
            sampled = time.monotonic()
            record = measure(len(records), output, client, model, adapter if config.compare_previous else None)
            record.rollout_s, record.measure_s = sampled - began, time.monotonic() - sampled
            record.groups_with_spread = _spread(output["rollserve_reward"], config.num_generations)
            records.append(record)
            return output

        class Sync(TrainerCallback):
            """After each optimizer step: save the adapter, load it into vLLM, resume at k+1."""

            def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
                record = records[-1]
                version = len(records)
                record.adapter_change = adapter.change(version)
                began = time.monotonic()
                sync.update(LoRA(config.adapter_name, adapter.save(version)), policy_version=version)
                record.sync_s = time.monotonic() - began
                record.step_s = time.monotonic() - starts[-1]

        dataset = Dataset.from_list(load_rows(config.data)).map(lambda row: {"prompt": task_prompt(row)})
        args = GRPOConfig(
            output_dir=str(out / "trainer"), per_device_train_batch_size=config.prompts_per_step
            * config.num_generations, num_generations=config.num_generations, max_steps=config.steps,
            learning_rate=config.learning_rate, logging_steps=1, report_to=[], save_strategy="no",
            use_cpu=True, seed=config.seed, gradient_checkpointing=False,
            bf16=False,  # TRL's default is bf16 autocast: the trainer's logprobs would be bf16's
            max_completion_length=config.max_tokens)
        trainer = GRPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                              reward_funcs=[rollserve_reward], rollout_func=rollout, callbacks=[Sync()])
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    for record, loss in zip(records, losses, strict=False):
        record.loss = float(loss)
        if on_step is not None:
            on_step(record)
    return records


def measure(step: int, output: RolloutOutput, client: Client, model: torch.nn.Module,
            adapter: Adapter | None) -> StepRecord:
    """Step ``step``'s rollouts against rollserve's store and the trainer's own logprobs
    (under version ``step``, the one that sampled, and, given ``adapter``, version
    ``step - 1``)."""
    record = StepRecord(step=step)
    sequences: list[tuple[list[int], int]] = []
    sampled: list[list[float]] = []
    keep: list[list[int]] = []
    matches: list[bool] = []
    for i, sample_id in enumerate(output["rollserve_id"]):
        stored = client.rollout(str(sample_id)).result
        if stored is None:
            raise RuntimeError(f"rollout {sample_id}: no result stored")
        record.samples += 1
        record.policy_versions.extend(stored.trajectory.policy_versions)
        if output["rollserve_masked"][i]:
            record.masked += 1
            continue
        prompt_ids = [int(t) for t in output["prompt_ids"][i]]
        ids = [*prompt_ids, *(int(t) for t in output["completion_ids"][i])]
        matches.append(list(stored.trajectory.tokens.input_ids) == ids)
        sequences.append((ids, len(prompt_ids)))
        sampled.append([float(v) for v in output["logprobs"][i]])
        keep.append([j for j, m in enumerate(output["env_mask"][i]) if m])
    new, old = Mismatch(), Mismatch()
    if sequences:
        model.eval()
        try:
            for row, trainer in enumerate(logprobs_of(model, sequences)):
                new.add(trainer, sampled[row], keep[row])
            if step > 0 and adapter is not None:
                with adapter.swapped(step - 1):
                    for row, trainer in enumerate(logprobs_of(model, sequences)):
                        old.add(trainer, sampled[row], keep[row])
        finally:
            model.train()
    record.tokens_match = bool(matches) and all(matches)
    record.tokens = len(new.deltas)
    record.mean_abs_delta, record.max_abs_delta, record.mean_ratio = new.summary()
    if step > 0 and adapter is not None:
        record.old_mean_abs_delta, record.old_max_abs_delta, _ = old.summary()
    rewards = [float(r) for r in output["rollserve_reward"] if isinstance(r, float | int)]
    record.reward_mean = sum(rewards) / len(rewards) if rewards else math.nan
    return record


def _spread(rewards: list[float | None] | object, group: int) -> int:
    values = list(rewards) if isinstance(rewards, list) else []
    groups = [values[i:i + group] for i in range(0, len(values), group)]
    return sum(1 for g in groups if len({r for r in g if r is not None}) > 1)


# --- report ---------------------------------------------------------------------------
COLUMNS = ["step", "policy version", "samples", "masked", "tokens", "mean |Δ|", "max |Δ|",
           "mean ratio", "old mean |Δ|", "reward", "groups w/ spread", "loss", "adapter Δ", "ids = stored"]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(records: list[StepRecord]) -> str:
    rows = [[str(r.step), ",".join(str(v) for v in sorted(set(r.policy_versions))), str(r.samples),
             str(r.masked), str(r.tokens), _fmt(r.mean_abs_delta, ".2e"), _fmt(r.max_abs_delta, ".2e"),
             _fmt(r.mean_ratio, ".6f"), _fmt(r.old_mean_abs_delta, ".2e"), _fmt(r.reward_mean, ".3f"),
             str(r.groups_with_spread), _fmt(r.loss, ".4f"), _fmt(r.adapter_change, ".3e"),
             "yes" if r.tokens_match else "NO"] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(COLUMNS)]
    lines = [" | ".join(c.rjust(w) for c, w in zip(COLUMNS, widths)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> tuple[RunConfig, Path]:
    defaults = RunConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=defaults.model, help="fp32 HF folder vLLM serves")
    parser.add_argument("--data", type=Path, default=defaults.data, help="tasks, JSONL")
    parser.add_argument("--out", type=Path, default=None, help="adapters, logs (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=Path("trl_grpo.json"), help="where the report goes")
    parser.add_argument("--rollserve", default=None, help="a running rollserve's URL")
    parser.add_argument("--vllm", default=defaults.vllm, help="vLLM URL (when rollserve is started here)")
    for name in ("steps", "prompts_per_step", "num_generations", "max_tokens", "lora_rank", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--adapter-name", default=defaults.adapter_name)
    parser.add_argument("--timeout", type=float, default=defaults.timeout)
    ns = parser.parse_args(argv)
    out = ns.out or Path(tempfile.mkdtemp(prefix="trl_grpo_"))
    config = RunConfig(model=ns.model, data=ns.data, out=out, rollserve=ns.rollserve, vllm=ns.vllm,
                       steps=ns.steps, prompts_per_step=ns.prompts_per_step, num_generations=ns.num_generations,
                       max_tokens=ns.max_tokens, learning_rate=ns.learning_rate, lora_rank=ns.lora_rank,
                       adapter_name=ns.adapter_name, seed=ns.seed, timeout=ns.timeout)
    return config, ns.json


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse(argv)
    # SIGTERM (a timeout's kill) unwinds like Ctrl-C, so the rollserve started here stops too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    records = run(config)
    print(table(records))
    payload = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
               "wall_s": time.monotonic() - began, "steps": [asdict(r) for r in records]}
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

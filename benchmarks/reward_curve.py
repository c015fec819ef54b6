"""The reward curve of a real GRPO run: examples/trl_grpo.py's loop, run longer.

TRL's GRPOTrainer trains a LoRA adapter of SmolLM2-135M-Instruct on rollouts rollserve
samples from a real vLLM (CPU) server; after every optimizer step the adapter is loaded
into vLLM and rollserve resumes at the next policy version. The reward is rollserve's
own (the ``stem`` handler: the letter the reply ends with, against the gold letter) on
the example's bundled two-choice questions. Per step it records the mean reward, the
train-inference mismatch (mean |Δ| of the trainer's fp32 logprobs against rollserve's,
under the adapter that sampled), the loss and the adapter's change, and writes
``results/reward_curve.json`` and ``results/reward_curve.png``.

Needs a vLLM serving SmolLM2 with runtime LoRA (``ROLLSERVE_VLLM_LORA=1
scripts/vllm_cpu/start.sh``), ``rollserve[trl,bench]``; not run in CI.

    python -m benchmarks.reward_curve [--vllm http://127.0.0.1:8011] [--steps 30]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from examples.trl_grpo import DEFAULT_MODEL, RunConfig, StepRecord, run

from benchmarks.common import RESULTS, report

COLUMNS = ["step", "policy version", "reward", "mean |Δ|", "max |Δ|", "mean ratio", "loss",
           "adapter Δ", "rollout s", "step s"]


def rolling(values: list[float], width: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - width + 1):i + 1] if not math.isnan(v)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def plot(records: list[StepRecord], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    rewards = [r.reward_mean for r in records]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    top.plot(steps, rewards, "o", alpha=0.45, label="mean reward of the step's rollouts")
    top.plot(steps, rolling(rewards, 5), "-", linewidth=2, label="rolling mean (5 steps)")
    top.set_ylabel("rollserve reward")
    top.set_ylim(-0.05, 1.05)
    top.set_title(title, fontsize=10)
    top.legend(loc="lower right", fontsize=8)
    top.grid(alpha=0.3)
    bottom.semilogy(steps, [r.mean_abs_delta for r in records], "s-", markersize=3,
                    label="mean |Δ| trainer vs rollserve logprobs")
    bottom.axhline(1e-3, color="red", linestyle="--", linewidth=1, label="target 1e-3")
    bottom.set_xlabel("optimizer step (= policy version of its rollouts)")
    bottom.set_ylabel("mean |Δ|")
    bottom.legend(loc="upper right", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", default="http://127.0.0.1:8011")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=Path("/tmp/rollserve_reward_curve"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = RunConfig(model=args.model, out=args.out, vllm=args.vllm, steps=args.steps,
                       prompts_per_step=args.prompts_per_step, num_generations=args.num_generations,
                       max_tokens=args.max_tokens, learning_rate=args.learning_rate, seed=args.seed,
                       adapter_name="reward-curve", compare_previous=False)
    began = time.monotonic()
    records = run(config, on_step=lambda r: print(f"step {r.step}: reward {r.reward_mean:.3f}", flush=True))
    wall = time.monotonic() - began
    rows = [[r.step, sorted(set(r.policy_versions)), r.reward_mean, r.mean_abs_delta, r.max_abs_delta,
             r.mean_ratio, r.loss, r.adapter_change, r.rollout_s, r.step_s] for r in records]
    first, last = records[: len(records) // 3], records[-(len(records) // 3):]
    summary = {"reward_first_third": sum(r.reward_mean for r in first) / len(first),
               "reward_last_third": sum(r.reward_mean for r in last) / len(last),
               "mean_abs_delta_max_over_steps": max(r.mean_abs_delta for r in records)}
    title = (f"GRPO, SmolLM2-135M LoRA r{config.lora_rank}, {config.prompts_per_step}x"
             f"{config.num_generations} rollouts/step via rollserve + vLLM CPU")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(records, RESULTS / "reward_curve.png", title)
    report("reward_curve", title, COLUMNS, rows, {
        "config": {"steps": config.steps, "prompts_per_step": config.prompts_per_step,
                   "num_generations": config.num_generations, "max_tokens": config.max_tokens,
                   "learning_rate": config.learning_rate, "lora_rank": config.lora_rank,
                   "seed": config.seed, "data": str(config.data.name)},
        "wall_s": wall, "summary": summary, "figure": "reward_curve.png"})


if __name__ == "__main__":
    main()

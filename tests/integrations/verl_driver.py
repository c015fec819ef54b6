"""Run in the verl venv by tests/integrations/test_verl_loop.py (not a test itself).

Drives verl 0.9's own rollout path as its PPO trainer does (``ray_trainer.fit``): verl's
trainer config (``ppo_trainer.yaml``, composed by hydra with the test's overrides), a
parquet file read by verl's ``RLHFDataset``, batched by its ``collate_fn`` into a
``DataProto``, a ``uid`` per prompt, repeated ``n`` times, and handed to an
``AgentLoopWorker`` (the class itself, without Ray) whose ``generate_sequences`` runs
the agent loop named in each row, padded and batched by verl. Prints what verl made
of each sample, unpadded, as JSON on the last line of stdout.

With ``verl_servers`` (``host:port`` addresses) in the spec, the worker's LLM client is
verl's own ``LLMServerClient`` over verl's load balancer (a Ray actor, on a local Ray
started here) that lists those addresses as verl's inference servers.

argv[1]: a JSON file: model_dir, rows (a JSON file of dataset rows, written here as
parquet with pandas, as verl's data preparation scripts do), loop_config (the agent loop config file),
n, prompt_length, response_length, validate.
"""

import asyncio
import json
import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={spec['model_dir']}",
                # verl's inference engine: the config needs one; rollserve's backends sample
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={spec['prompt_length']}",
                f"actor_rollout_ref.rollout.response_length={spec['response_length']}",
                f"actor_rollout_ref.rollout.n={spec['n']}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={spec['loop_config']}",
                f"data.max_prompt_length={spec['prompt_length']}",
                f"data.max_response_length={spec['response_length']}",
            ],
        )
    if not spec.get("verl_servers"):
        return run(spec, config, None)
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        balancer = get_router_handle({address: None for address in spec["verl_servers"]})
        run(spec, config, LLMServerClient(config, load_balancer_handle=balancer))
    finally:
        ray.shutdown()  # its processes end with it


def run(spec: dict, config: DictConfig, llm_client: object) -> None:
    parquet = str(Path(spec["rows"]).with_suffix(".parquet"))
    pd.DataFrame(json.loads(Path(spec["rows"]).read_text())).to_parquet(parquet)
    worker = AgentLoopWorker(config, llm_client=llm_client)
    dataset = RLHFDataset(
        data_files=[parquet], tokenizer=worker.tokenizer, config=config.data, processor=worker.processor
    )
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    batch = batch.repeat(repeat_times=spec["n"], interleave=True)
    batch.meta_info["validate"] = spec["validate"]
    out = asyncio.run(worker.generate_sequences(batch))

    samples = []
    for i in range(len(out)):
        prompt_mask = out.batch["attention_mask"][i, : spec["prompt_length"]].bool()
        response_mask = out.batch["attention_mask"][i, spec["prompt_length"] :].bool()
        samples.append(
            {
                "prompt_ids": out.batch["prompts"][i][prompt_mask].tolist(),
                "response_ids": out.batch["responses"][i][response_mask].tolist(),
                "response_mask": out.batch["response_mask"][i][response_mask].tolist(),
                "rollout_log_probs": out.batch["rollout_log_probs"][i][response_mask].tolist(),
                "rm_scores": out.batch["rm_scores"][i].tolist(),
                "num_turns": int(out.non_tensor_batch["__num_turns__"][i]),
                "uid": str(out.non_tensor_batch["uid"][i]),
                "rollserve": out.non_tensor_batch["rollserve"][i],
                "rollserve_masked": float(out.non_tensor_batch["rollserve_masked"][i]),
                "shapes": {key: list(out.batch[key].shape) for key in ("prompts", "responses")},
            }
        )
    print(
        json.dumps(
            {
                "samples": samples,
                "metrics": out.meta_info["metrics"],
                "reward_extra_keys": out.meta_info.get("reward_extra_keys"),
            }
        )
    )


if __name__ == "__main__":
    main()

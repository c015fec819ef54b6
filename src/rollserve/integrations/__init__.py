"""Trainer integrations: rollserve as the rollout engine of an RL trainer.

- ``trl``: TRL's ``GRPOTrainer(rollout_func=...)`` (``rollout_func``, ``task_prompt``,
  ``rollserve_reward``).
- ``tensors``: a ``RolloutResult`` as prompt ids, completion ids, logprobs and masks.
- ``groups``: submit a batch and wait, bounded, for every sample it asked for.

These modules import only ``rollserve.client`` and ``rollserve.contract`` (and the
trainer's library, lazily): they work in a client-only install.
"""

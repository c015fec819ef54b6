"""Trainer integrations: rollserve as the rollout engine of an RL trainer.

- ``trl``: TRL's ``GRPOTrainer(rollout_func=...)`` (``rollout_func``, ``task_prompt``,
  ``rollserve_reward``).
- ``tensors``: a ``RolloutResult`` as prompt ids, completion ids, logprobs and masks.
- ``groups``: submit a batch, wait (bounded) for each group's verdict, and give each
  group as ``n`` rows (its used samples; masked rows for a group not fit to train on)
  with the batch's counts.

These modules import only ``rollserve.client`` and ``rollserve.contract`` (and the
trainer's library, lazily): they work in a client-only install.
"""

"""Trainer integrations: rollserve as the rollout engine of an RL trainer.

- ``trl``: TRL's ``GRPOTrainer(rollout_func=...)`` (``rollout_func``, ``task_prompt``,
  ``rollserve_reward``).
- ``tensors``: a ``RolloutResult`` as prompt ids, completion ids, logprobs and masks.
- ``groups``: submit a batch, wait (bounded) for each group's verdict, and give each
  group as ``n`` rows (its used samples; masked rows for a group not fit to train on)
  with the batch's counts.
- ``verl``: verl 0.9's agent loop ``rollserve`` (``RollserveAgentLoop``); it imports verl
  at module level, so it is imported only where verl is (``pip install
  'rollserve[verl]'``; without verl importing it is an ImportError naming that extra).
- ``verl_rows``: that loop's parts that need no verl (``verl_row`` builds a dataset row).

These modules import only ``rollserve.client`` and ``rollserve.contract`` (and the
trainer's library: lazily, except ``verl``): they work in a client-only install. This
package imports none of them.
"""

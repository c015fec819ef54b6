"""One ``RolloutResult`` as a trainer's prompt/completion pair, shared by the adapters.

A rollserve trajectory is one append-only token sequence (``trajectory.tokens``). A
trainer that thinks in prompt and completion (TRL, verl) gets:

- ``prompt_ids``: the first turn's prompt (``turns[0].prompt_ids_delta``);
- ``completion_ids``: every later token, sampled and environment alike, in order;
- ``logprobs``: the backend's logprob on each sampled token, 0.0 on environment tokens;
- ``env_mask``: rollserve's ``loss_mask`` over the completion (1 exactly on sampled
  tokens).

A sample that must not be trained on (``mask`` true: an infrastructure failure, a
timeout, an interruption; or nothing scored; or no token ids at all) keeps its tokens
but gets ``env_mask`` all 0 and ``reward`` None. Trainers index a completion's last
token, so an empty prompt or completion is filled with one ``filler_id`` token (the
tokenizer's EOS), masked 0. Nothing here is ever re-tokenized.

A trajectory of several sequences (``trajectory.sequence_count`` > 1: a harness behind
the gateway rewrote its history) has no single prompt/completion pair: gluing its
sequences together would train tokens on contexts the policy never saw. ``to_sample``
refuses it with a ``MultiSequenceError`` naming the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pydantic import JsonValue

from rollserve.contract import RolloutResult


class MultiSequenceError(ValueError):
    """A result whose trajectory is several token sequences, which one prompt/completion
    pair cannot hold."""

    def __init__(self, result_id: str, sequence_count: int) -> None:
        super().__init__(
            f"rollout {result_id}: its trajectory is {sequence_count} token sequences (the "
            "harness rewrote its history), and a prompt/completion pair holds one; train on "
            "each of trajectory.sequences as its own sample, or keep the harness's history "
            "append-only"
        )
        self.result_id = result_id
        self.sequence_count = sequence_count


@dataclass(frozen=True)
class Sample:
    """One rollout split at the end of its first prompt."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float | None
    masked: bool
    result_id: str
    group_id: str
    info: dict[str, JsonValue]
    # the result's named reward components (None when masked or when it has none)
    reward_components: dict[str, float] | None = None


def trainable(result: RolloutResult) -> bool:
    """Whether a result may enter the loss: not masked, scored, and made of token ids."""
    return (
        not result.mask and result.reward is not None and result.trajectory.trainable and bool(result.trajectory.turns)
    )


def info(result: RolloutResult) -> dict[str, JsonValue]:
    """What a trainer may want to log or filter on, as plain JSON."""
    return {
        "id": result.id,
        "group_id": result.group_id,
        "task_id": result.task_id,
        "data_source": result.data_source,
        "sample_index": result.sample_index,
        "status": result.status,
        "mask": result.mask,
        "mask_reason": result.mask_reason,
        "ended_by": result.trajectory.ended_by,
        "stale": result.stale,
        "policy_versions": list(result.trajectory.policy_versions),
        "turns": result.stats.turns,
        "metadata": result.metadata,
        "reward_components": cast("JsonValue", reward_components(result)),
    }


def reward_components(result: RolloutResult) -> dict[str, float] | None:
    """The result's named reward components where it enters the loss (``trainable``),
    None otherwise, as its reward is: one rule for a sample and its info."""
    if not trainable(result) or result.reward_components is None:
        return None
    return dict(result.reward_components)


def to_sample(result: RolloutResult, filler_id: int) -> Sample:
    """Split ``result`` into prompt and completion (see the module's docstring); a
    result of several sequences is a ``MultiSequenceError``."""
    if result.trajectory.sequence_count > 1:
        raise MultiSequenceError(result.id, result.trajectory.sequence_count)
    tokens = result.trajectory.tokens
    turns = result.trajectory.turns
    cut = len(turns[0].prompt_ids_delta) if turns else len(tokens.input_ids)
    prompt_ids = list(tokens.input_ids[:cut])
    completion_ids = list(tokens.input_ids[cut:])
    logprobs = list(tokens.logprobs[cut:])
    env_mask = list(tokens.loss_mask[cut:])
    ok = trainable(result)
    if not ok:
        env_mask = [0] * len(env_mask)
    if not prompt_ids:
        prompt_ids = [filler_id]
    if not completion_ids:
        completion_ids, logprobs, env_mask = [filler_id], [0.0], [0]
    return Sample(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        logprobs=logprobs,
        env_mask=env_mask,
        reward=result.reward if ok else None,
        masked=not ok,
        result_id=result.id,
        group_id=result.group_id,
        info=info(result),
        reward_components=reward_components(result),
    )

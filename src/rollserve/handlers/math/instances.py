"""Math instances: validation of the two forms (question + answer, or a reasoning-gym
entry) and the identity of a reasoning-gym entry, for the math handlers."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollserve.handlers.base import InvalidInstance
from rollserve.handlers.math.scoring import dataset_key
from rollserve.handlers.seeds import salted_seed, seed_details

# reasoning-gym datasets are virtual: entry i is generated from Random(seed + i),
# so the size only bounds the index. 500 is reasoning-gym's own default.
DEFAULT_DATASET_SIZE = 500


@dataclass(frozen=True)
class GymEntry:
    """The identity of a reasoning-gym entry: everything needed to regenerate it."""

    dataset: str
    seed: int  # the generator's: the public seed salted (``handlers.seeds``)
    size: int
    index: int
    config_key: str  # the dataset options, canonical JSON (``math.scoring.dataset_key``)
    public_seed: int | None = None  # the instance's ``seed`` (None: ``seed`` is it)
    salt: str | None = None  # the store's salt that made ``seed``, never shown to a policy

    def seeding(self) -> dict[str, Any]:
        """What a result records: the public seed, the salt, the generator's seed."""
        public = self.seed if self.public_seed is None else self.public_seed
        return seed_details(public, self.salt)

    def args(self) -> tuple[str, int, int, str, int]:
        """As the positional (name, seed, size, config_key, index) of the reasoning-gym
        worker functions (``math.scoring``)."""
        return (self.dataset, self.seed, self.size, self.config_key, self.index)


def _reasoning_gym_datasets() -> dict[str, tuple[type, type]]:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_question_form(instance: Mapping[str, Any]) -> None:
    question = instance.get("question")
    if question is None:
        raise InvalidInstance("instance.question", "required (or give 'dataset' for reasoning-gym)")
    if not isinstance(question, str) or not question.strip():
        raise InvalidInstance("instance.question", "must be a non-empty string")
    if "answer" not in instance:
        raise InvalidInstance("instance.answer", "required: the gold answer (LaTeX or a number)")
    answer = instance["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise InvalidInstance("instance.answer", "must be a string or a number")
    if not str(answer).strip():
        raise InvalidInstance("instance.answer", "must not be empty")


def validate_dataset_form(instance: Mapping[str, Any]) -> None:
    name = instance["dataset"]
    datasets = _reasoning_gym_datasets()
    _check_dataset_name(name, datasets)
    if "seed" not in instance:
        raise InvalidInstance("instance.seed", "required for a reasoning-gym instance")
    if not _is_int(instance["seed"]):
        raise InvalidInstance("instance.seed", "must be an integer")
    index = instance.get("index", 0)
    if not _is_int(index) or index < 0:
        raise InvalidInstance("instance.index", "must be an integer >= 0")
    config = instance.get("config", {})
    config_cls = datasets[name][1]
    _check_config_keys(name, config, config_cls)
    size = _dataset_size(instance)
    if not _is_int(size) or size < 1:
        raise InvalidInstance("instance.config.size", "must be an integer >= 1")
    if index >= size:
        raise InvalidInstance("instance.index", f"must be < config.size ({size})")
    try:  # the dataset's own checks (reasoning-gym asserts on bad values)
        checked = config_cls(**{**config, "seed": instance["seed"], "size": size})
        # A reasoning-gym config's validate() is optional (two of its configs have
        # none): probed as reasoning_gym.create_dataset does, a third-party convention.
        if callable(getattr(checked, "validate", None)):
            checked.validate()
    except Exception as exc:  # AssertionError, ValueError, TypeError from a dataclass
        raise InvalidInstance("instance.config", f"rejected by {name!r}: {exc or type(exc).__name__}") from None


def _check_dataset_name(name: Any, datasets: dict[str, tuple[type, type]]) -> None:
    """A reasoning-gym dataset's name; an unknown one is refused with the closest names."""
    if not isinstance(name, str):
        raise InvalidInstance("instance.dataset", "must be a string (a reasoning-gym dataset name)")
    if name not in datasets:
        known = sorted(datasets)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InvalidInstance(
            "instance.dataset",
            f"unknown reasoning-gym dataset {name!r} (known: {', '.join(known[:8])}, ... {len(known)} in all){hint}",
        )


def _check_config_keys(name: str, config: Any, config_cls: type) -> None:
    """``config``: a JSON object of the dataset's options (its seed is ``instance.seed``)."""
    if not isinstance(config, dict):
        raise InvalidInstance("instance.config", "must be an object of dataset options")
    if "seed" in config:
        raise InvalidInstance("instance.config.seed", "give the seed as instance.seed")
    try:
        json.dumps(config)
    except (TypeError, ValueError):
        raise InvalidInstance("instance.config", "must be JSON-serialisable") from None
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name != "seed"]
    for key in config:
        if key not in fields:
            raise InvalidInstance(
                f"instance.config.{key}",
                f"unknown option for dataset {name!r} (known: {', '.join(fields)})",
            )


def _dataset_size(instance: Mapping[str, Any]) -> int:
    config = instance.get("config") or {}
    return config.get("size", max(DEFAULT_DATASET_SIZE, instance.get("index", 0) + 1))


def gym_entry(instance: Mapping[str, Any], salt: str | None = None) -> GymEntry:
    """The reasoning-gym entry a (valid) dataset-form instance names; with the store's
    ``salt``, the generator's seed is the public one salted (``handlers.seeds``)."""
    config = {k: v for k, v in (instance.get("config") or {}).items() if k != "size"}
    seed = instance["seed"]
    return GymEntry(
        dataset=instance["dataset"],
        seed=salted_seed(seed, salt),
        size=_dataset_size(instance),
        index=instance.get("index", 0),
        config_key=dataset_key(config),
        public_seed=seed,
        salt=salt,
    )

"""A request's messages validated a slice at a time.

The gateway parses a request on a worker thread so the event loop keeps serving, but
pydantic validates a whole model in one call that holds the GIL: a body of a hundred
thousand small messages held the loop for seconds although it was "off the loop".
``validate_sliced`` validates ``messages`` in slices of ``SLICE`` (the GIL is passed
between them), then the request with those messages as instances (not validated
again). A slice that fails is validated once more in place, after the instances
before it, so the error names the same field at the same index as a whole-model
validation would.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

__all__ = ["SLICE", "validate_sliced"]

SLICE = 128
M = TypeVar("M", bound=BaseModel)


@lru_cache(maxsize=8)
def _items(model: type[BaseModel], field: str) -> TypeAdapter[list[Any]]:
    annotation: Any = model.model_fields[field].annotation  # (a list of models)
    return TypeAdapter(annotation)


def validate_sliced(model: type[M], value: Any, field: str = "messages") -> M:
    """``model.model_validate(value)``, its ``field`` list validated a slice at a time
    (the same result and the same first error)."""
    items = value.get(field) if isinstance(value, dict) else None
    if not isinstance(items, list) or len(items) <= SLICE:
        return model.model_validate(value)
    adapter = _items(model, field)
    checked: list[Any] = []
    for start in range(0, len(items), SLICE):
        part = items[start : start + SLICE]
        try:
            checked.extend(adapter.validate_python(part))
        except ValidationError:
            # Again in place: the error's location is the whole model's.
            return model.model_validate({**value, field: checked + part})
    return model.model_validate({**value, field: checked})

"""A task family for dataset-tooling tests: each instance names its environment images."""

from __future__ import annotations

from typing import Any

from rollserve.handlers.base import AgentHandler, Evaluation, HandlerDefaults, InvalidInstance
from rollserve.handlers.registry import HandlerRegistry


class ImageHandler(AgentHandler):
    """``{"image": ref}`` or ``{"images": [ref, ...]}``; ``images()`` lists them."""

    name = "imaged"
    defaults = HandlerDefaults()

    def validate(self, instance: dict[str, Any]) -> None:
        if not instance.get("image") and not instance.get("images"):
            raise InvalidInstance("instance.image", "required: the environment image")

    def images(self, instance: dict[str, Any]) -> list[str]:
        if instance.get("explode"):
            raise RuntimeError("cannot list images")
        return list(instance.get("images") or [instance["image"]])

    async def init(self, rollout) -> None: ...

    async def run(self, rollout) -> None: ...

    async def eval(self, rollout) -> Evaluation:
        return Evaluation(0.0)

    async def cleanup(self, rollout) -> None: ...


def registry_with_images() -> HandlerRegistry:
    registry = HandlerRegistry(discover=False)
    registry.register("imaged", ImageHandler)
    return registry

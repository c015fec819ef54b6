"""Fetching environment images ahead of time (``rollserve images pull``).

A dataset's rollouts may each need a container image (SWE-bench: one per task);
building them on first use would stall the first rollouts for minutes. This module
fetches a list of references into the place a server's runtime looks for them, with
the runtime's own image methods (``ImageRuntime`` in base.py):

- apptainer / singularity: ``.sif`` files in the image cache, built by the same
  ``ImageCache`` the runtime uses (same file names, same locks), so a server using
  that cache (``STATE_DIR/images`` or its ``image_cache`` option) finds them built;
- docker / podman: ``<engine> pull REF`` into the engine's own store.

At most ``concurrency`` fetches run at once; a failed one is retried with
exponential backoff; what is already there is skipped. Knows nothing of datasets or
handlers: the caller says which references.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollserve.sandbox.base import BadImageReference, ImageRuntime, SandboxError
from rollserve.sandbox.registry import RUNTIMES, image_runtimes, runtime_config

__all__ = [
    "BadImageReference",
    "PullResult",
    "RuntimeMissing",
    "image_runtime",
    "make_puller",
    "normalize_reference",
    "pull_images",
]


class RuntimeMissing(Exception):
    """The runtime's binary is not on PATH; the message says what to install."""


@dataclass
class PullResult:
    reference: str
    ok: bool
    attempts: int = 0  # fetches tried (0: it was already there)
    error: str | None = None  # the last attempt's error
    cached: bool = False  # already there: nothing fetched


def image_runtime(
    runtime: str, image_cache: Path | None = None, concurrency: int = 4, timeout: float = 3600.0
) -> ImageRuntime[Any]:
    """Runtime ``runtime`` made to fetch images (into ``image_cache`` where it keeps
    its own), whether it can run here or not; a ValueError for a runtime without images."""
    cls = RUNTIMES.get(runtime)
    if cls is None or not issubclass(cls, ImageRuntime):
        raise ValueError(f"unknown image runtime {runtime!r}; known: {', '.join(image_runtimes())}")
    cache = image_cache if image_cache is not None else Path.home() / ".cache" / "rollserve" / "sif"
    return cls.for_pulling(runtime_config(runtime), cache, concurrency, timeout)


def make_puller(runtime: str, image_cache: Path, concurrency: int = 4, timeout: float = 3600.0) -> ImageRuntime[Any]:
    """``image_runtime``, checked: ``RuntimeMissing`` saying what to install if its
    binary is not here."""
    puller = image_runtime(runtime, image_cache, concurrency, timeout)
    if reason := puller.images_unavailable_reason():
        raise RuntimeMissing(reason)
    return puller


def normalize_reference(reference: str, runtime: str) -> str:
    """``reference`` as ``runtime`` fetches it (``ImageRuntime.image_reference``):
    apptainer builds a bare docker name (``python:3.12``) as ``docker://python:3.12``;
    docker/podman drop ``docker://``. BadImageReference for one it cannot fetch."""
    return image_runtime(runtime).image_reference(reference)


async def pull_images(
    references: list[str],
    puller: ImageRuntime[Any],
    concurrency: int = 4,
    retries: int = 2,
    backoff: float = 2.0,
    on_result: Callable[[PullResult], None] | None = None,
    on_retry: Callable[[str, int, str], None] | None = None,
) -> list[PullResult]:
    """Fetch each reference (deduplicated, in order) at most ``concurrency`` at a time,
    retrying a failure up to ``retries`` times after ``backoff * 2**k`` seconds.
    ``on_result`` sees each finished reference, ``on_retry(ref, attempt, error)`` each
    retry. Never raises for a reference: failures come back in the results."""
    gate = asyncio.Semaphore(max(1, concurrency))  # held per attempt, not while backing off

    async def one(reference: str) -> PullResult:
        result = await _fetch(reference, puller, gate, retries, backoff, on_retry)
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(one(r) for r in dict.fromkeys(references))))


async def _fetch(
    reference: str,
    puller: ImageRuntime[Any],
    gate: asyncio.Semaphore,
    retries: int,
    backoff: float,
    on_retry: Callable[[str, int, str], None] | None,
) -> PullResult:
    attempts = 0
    while True:
        async with gate:
            attempts += 1
            try:
                if attempts == 1 and await puller.image_cached(reference):
                    return PullResult(reference, ok=True, cached=True)
                await puller.pull_image(reference)
                return PullResult(reference, ok=True, attempts=attempts)
            except BadImageReference as exc:
                return PullResult(reference, ok=False, attempts=attempts, error=str(exc))
            except (TimeoutError, SandboxError, OSError) as exc:
                error = str(exc) or type(exc).__name__
        if attempts > retries:
            return PullResult(reference, ok=False, attempts=attempts, error=error)
        if on_retry is not None:
            on_retry(reference, attempts, error)
        await asyncio.sleep(backoff * 2 ** (attempts - 1))

"""Fetching environment images ahead of time (``rollserve images pull``).

A dataset's rollouts may each need a container image (SWE-bench: one per task);
building them on first use would stall the first rollouts for minutes. This module
fetches a list of references into the place a server's runtime looks for them:

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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from rollserve.sandbox.apptainer import BINARIES, BUILDABLE, ImageCache
from rollserve.sandbox.base import SandboxError
from rollserve.sandbox.process import run_command

RUNTIMES = ("apptainer", "singularity", "docker", "podman")
INSTALL_HINTS = {
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html; "
                 "on a cluster often `module load apptainer`), or pick --runtime docker/podman",
    "docker": "install Docker Engine (https://docs.docker.com/engine/install/) and start its "
              "daemon, or pick --runtime podman/apptainer",
    "podman": "install Podman (https://podman.io/docs/installation), or pick --runtime "
              "docker/apptainer",
}


class RuntimeMissing(Exception):
    """The runtime's binary is not on PATH; the message says what to install."""


class PermanentError(Exception):
    """A reference that no retry can fetch (e.g. a missing .sif path)."""


@dataclass
class PullResult:
    reference: str
    ok: bool
    attempts: int = 0  # fetches tried (0: it was already there)
    error: str | None = None  # the last attempt's error
    cached: bool = False  # already there: nothing fetched


class Puller(Protocol):
    async def cached(self, reference: str) -> bool: ...

    async def pull(self, reference: str) -> None: ...


def normalize_reference(reference: str, runtime: str) -> str:
    """``reference`` as the runtime fetches it: apptainer builds a bare docker name
    (``python:3.12``) as ``docker://python:3.12``; docker/podman drop ``docker://``.
    Raises ``PermanentError`` for a reference the runtime cannot fetch."""
    reference = reference.strip()
    if runtime in ("apptainer", "singularity"):
        is_path = reference.startswith(("/", "./", "../", "~")) or reference.endswith(".sif")
        if reference.startswith(BUILDABLE) or is_path or "://" in reference:
            return reference
        return f"docker://{reference}"
    if reference.startswith("docker://"):
        return reference[len("docker://"):]
    if "://" in reference or reference.endswith(".sif"):
        raise PermanentError(f"{runtime} cannot pull {reference!r} (an apptainer image); "
                             "use --runtime apptainer")
    return reference


class ApptainerPuller:
    """Builds references into ``.sif`` files in ``cache_dir`` with the runtime's cache."""

    def __init__(self, cache_dir: Path, binary: str, concurrency: int, timeout: float):
        self.cache = ImageCache(cache_dir, binary, concurrency, timeout)

    async def cached(self, reference: str) -> bool:
        if not reference.startswith(BUILDABLE):
            if not Path(reference).expanduser().is_file():
                raise PermanentError(f"{reference!r} is neither a .sif file nor a reference "
                                     f"apptainer builds from ({', '.join(BUILDABLE)})")
            return True
        return self.cache.path_for(reference).exists()

    async def pull(self, reference: str) -> None:
        await self.cache.ensure(reference)


class EnginePuller:
    """``docker pull`` / ``podman pull``; an image the engine has is skipped."""

    def __init__(self, binary: str, timeout: float):
        self.binary = binary
        self.timeout = timeout

    async def cached(self, reference: str) -> bool:
        result = await run_command([self.binary, "image", "inspect", reference], 60.0,
                                   max_output=4096)
        return result.ok

    async def pull(self, reference: str) -> None:
        result = await run_command([self.binary, "pull", reference], self.timeout, max_output=16384)
        if not result.ok:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SandboxError(f"{self.binary} pull {reference} failed ({why}): "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")


def find_runtime_binary(runtime: str) -> str:
    """The binary for ``runtime`` (apptainer falls back to singularity and back);
    ``RuntimeMissing`` saying what to install if there is none."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    candidates = ([runtime, *(b for b in BINARIES if b != runtime)]
                  if runtime in BINARIES else [runtime])
    for name in candidates:
        if shutil.which(name):
            return name
    hint = INSTALL_HINTS["apptainer" if runtime in BINARIES else runtime]
    raise RuntimeMissing(f"{' or '.join(candidates)} is not on PATH: {hint}")


def make_puller(runtime: str, image_cache: Path, concurrency: int = 4,
                timeout: float = 3600.0) -> Puller:
    binary = find_runtime_binary(runtime)
    if runtime in BINARIES:
        return ApptainerPuller(image_cache, binary, concurrency, timeout)
    return EnginePuller(binary, timeout)


async def pull_images(references: list[str], puller: Puller, concurrency: int = 4,
                      retries: int = 2, backoff: float = 2.0,
                      on_result: Callable[[PullResult], None] | None = None,
                      on_retry: Callable[[str, int, str], None] | None = None) -> list[PullResult]:
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


async def _fetch(reference: str, puller: Puller, gate: asyncio.Semaphore, retries: int,
                 backoff: float, on_retry: Callable[[str, int, str], None] | None) -> PullResult:
    attempts = 0
    while True:
        async with gate:
            attempts += 1
            try:
                if attempts == 1 and await puller.cached(reference):
                    return PullResult(reference, ok=True, cached=True)
                await puller.pull(reference)
                return PullResult(reference, ok=True, attempts=attempts)
            except PermanentError as exc:
                return PullResult(reference, ok=False, attempts=attempts, error=str(exc))
            except (SandboxError, OSError, asyncio.TimeoutError) as exc:
                error = str(exc) or type(exc).__name__
        if attempts > retries:
            return PullResult(reference, ok=False, attempts=attempts, error=error)
        if on_retry is not None:
            on_retry(reference, attempts, error)
        await asyncio.sleep(backoff * 2 ** (attempts - 1))

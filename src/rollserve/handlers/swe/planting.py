"""Writing the canaries (see ``canaries``) into the EVAL sandbox's graded test file,
between the test script's set-up (the test patch applied, its diff file deleted) and
its test run, so that no code of the candidate has run yet when they are written."""

from __future__ import annotations

import asyncio
import random
import secrets

from rollserve.handlers.swe import canaries
from rollserve.handlers.swe.canaries import Placement
from rollserve.handlers.swe.grade import canary_file
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

MAX_FILE_BYTES = 4 << 20


async def plant(sandbox: Sandbox, task: SWETask, count: int) -> Placement:
    """Put ``count`` canaries in the graded test file; what was placed, or why not."""
    path = canary_file(task)
    if path is None:
        return Placement(None, [], "no graded Python test file")
    try:
        data = await sandbox.read_file(path)
    except (OSError, ValueError) as error:
        return Placement(path, [], f"{path} could not be read: {type(error).__name__}")
    if len(data) > MAX_FILE_BYTES:
        return Placement(path, [], f"{path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return Placement(path, [], f"{path} is not UTF-8")
    rng = random.Random(secrets.randbits(64))  # (the seed is nowhere but here)
    placed = await asyncio.to_thread(canaries.place, path, text, task.fail_to_pass, task.pass_to_pass, count, rng)
    if placed is None:
        return Placement(path, [], f"no test in {path} has an assertion a canary can be made from")
    await sandbox.write_file(path, placed.text)
    return Placement(path, placed.canaries)

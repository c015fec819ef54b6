"""Seeds of procedurally generated instances (reasoning-gym's), salted per store.

A generated instance names its dataset and a seed; the seed is public (the trainer's
dataset file, and often a small integer). A policy that can run the generator (the
same library, a copy of it, or its algorithm rewritten) could search seeds until an
entry's question equals its own, then read that entry's answer. So the generator is
seeded with ``salted_seed(seed, salt)``: a hash of the public seed and a salt that
the server's store makes once, keeps, and never shows a policy (``Store.seed_salt``).
The same store regenerates the same instance for the same public seed (retries,
restarts, re-scoring); another store, another instance. Each result records the
salt and the seed the generator got (``seed_details``), so a re-scorer or another
framework can rebuild the entry. ``rollserve serve --public-seeds`` (the server's
``public_seeds``) turns the salt off: the generator then gets the public seed as it
is, as other frameworks seed it.
"""

from __future__ import annotations

import hashlib
from typing import Any

# The generator's seed is 63 bits of the hash: a non-negative int every generator takes.
SEED_BITS = 63


def salted_seed(seed: int, salt: str | None) -> int:
    """The seed the generator gets for public ``seed``: ``seed`` itself without a salt,
    else the first 63 bits of sha256("<salt>:<seed>")."""
    if salt is None:
        return seed
    digest = hashlib.sha256(f"{salt}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def seed_details(seed: int, salt: str | None) -> dict[str, Any]:
    """What a result records of an instance's seeding: enough to regenerate it."""
    return {"seed": seed, "seed_salt": salt, "generator_seed": salted_seed(seed, salt)}

"""A small least-recently-used cache bounded by what its entries cost, shared by threads.

Both token caches use it: a text's pieces' ids (``tokens.segments``) and opening
prompts' ids (``tokens.chat``). The policy decides what goes in either, so the bound
counts the memory an entry holds, not its characters: a piece of 4-byte characters
is ~4 ids a character. ``id_bytes`` is that cost for a text key and compact ids
(``compact``: 4 bytes an id, where a tuple of ints costs ~36).
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What an OrderedDict entry costs beyond its key and value (its hash slot and its
# link node: ~92 bytes measured with tracemalloc on CPython 3.12), with a margin.
ENTRY_BYTES = 128


def compact(ids: Iterable[int]) -> array[int]:
    """``ids`` as 4-byte unsigned ints (every tokenizer's ids fit)."""
    return array("I", ids)


def id_bytes(key: str, ids: array[int]) -> int:
    """The bytes an entry of text ``key`` and ids ``ids`` holds in a ``SizedLRU``."""
    return sys.getsizeof(key) + sys.getsizeof(ids) + ENTRY_BYTES


class SizedLRU(Generic[K, V]):
    """At most ``limit`` of ``cost(key, value)`` in all: the least recently used
    entries are dropped first, and an entry costing more than ``limit`` is not kept.
    A lock is held around each lookup and insert (render threads and the loop share it)."""

    def __init__(self, limit: int, cost: Callable[[K, V], int]) -> None:
        self.limit = limit
        self._cost = cost
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        cost = self._cost(key, value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._total -= old[1]
            if cost > self.limit:
                return
            self._entries[key] = (value, cost)
            self._total += cost
            while self._total > self.limit:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._total -= dropped

    @property
    def total(self) -> int:
        """The cost of what is held now (at most ``limit``)."""
        return self._total

    def items(self) -> list[tuple[K, V]]:
        """What is held, least recently used first (a copy)."""
        with self._lock:
            return [(key, value) for key, (value, _) in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

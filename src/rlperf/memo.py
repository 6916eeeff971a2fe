"""Bounded memos: the process-wide caches of pure results (rollouts, stage costs, packings, draws).

A planner asks for the same rollout, stage cost or micro-batch packing many times in one question
(the fast estimate, every simulated iteration, the what-ifs), so each such result is computed once
and kept. Memory stays bounded by dropping the least recently used entry:

    get(key):        a hit moves ``key`` to the newest end            (OrderedDict.move_to_end)
    put(key, value): insert; past ``max_entries`` drop the oldest one  (OrderedDict.popitem(last=False))

Every cache of this kind in rlperf is one :class:`BoundedMemo`, so refresh and eviction are
written once. Values must be immutable (or treated so by every caller): they are shared.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """Results by key, at most ``max_entries`` of them, least recently used dropped first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        got = self._entries.get(key)
        if got is not None:
            self._entries.move_to_end(key)
        return got

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key``, dropping the least recently used entry past the bound."""
        self._entries[key] = value
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for ``key``, made by ``make()`` and kept on a miss."""
        got = self.get(key)
        return self.put(key, make()) if got is None else got

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

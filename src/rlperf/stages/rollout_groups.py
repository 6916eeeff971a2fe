"""Group admission: the driver submits whole prompt groups and keeps at most ``M`` in flight.

verl's fully-async rollouter (``fully_async_rollouter.py``, ``_processor_worker``) takes one
*sample* at a time from its queue, a prompt with its ``rollout.n`` responses, and submits the
``n`` requests together (``generate_single_sample_async``); it keeps at most
``max_concurrent_samples = 16 x servers`` samples active and submits the next one only when an
active sample has *all* of its responses back. So the engines do not refill a slot when one
response finishes, as per-request admission does, but when the slowest response of a group
finishes. With ``M`` groups in flight, group ``k`` (in order of first appearance) is submitted at

    a_k = 0                                   for k < M
    a_k = the (k - M + 1)-th group completion  for k >= M

(a group completes when its last request finishes in this call). The requests in flight at any
time are the unfinished members of ``M`` groups, ``Σ_g (n - finished_g)``: with response lengths
that vary within a group, fewer than ``M·n`` on average, and the engine decodes smaller batches
than its slots allow.

:class:`GroupGate` follows the formula: ``initial()`` gives the requests of groups ``0 .. M-1``;
:meth:`GroupGate.finished` takes the requests that finished since the last call (the engine
appends them to ``Book.done_log``), counts the groups they complete, and schedules group
``k = M + completions - 1`` at the completion's time. ``completed`` also serves
``stop_after_num_groups``: a streamed trainer receives whole groups (verl's message queue holds
samples), so a call that feeds it stops once enough groups are complete.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np


class GroupGate:
    """Which requests the driver has submitted, for ``max_in_flight`` groups at a time
    (``None``: every group at once, only counting completions)."""

    def __init__(self, group_id: np.ndarray, arrival_s: np.ndarray, max_in_flight: int | None) -> None:
        _, first, inverse = np.unique(group_id, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.rank_of: list[int] = rank[inverse.reshape(-1)].tolist()  # request -> group rank
        members: list[list[int]] = [[] for _ in range(len(first))]
        for i, g in enumerate(self.rank_of):
            members[g].append(i)
        self.members = members
        self.left = [len(m) for m in members]  # requests of each group not finished yet
        self.arrival = arrival_s.tolist()
        m = len(members) if max_in_flight is None else min(max_in_flight, len(members))
        self.first = m
        self.pending: deque[int] = deque(range(m, len(members)))
        self.heap: list[tuple[float, int]] = []  # (submit time, request) of submitted groups
        self.completed = 0  # groups whose requests have all finished
        self.completed_at: list[float] = []  # time of each completion, in order

    def initial(self) -> list[int]:
        """Requests of the groups submitted at the start (each arrives at its own arrival_s)."""
        return sorted(i for g in range(self.first) for i in self.members[g])

    @property
    def next_s(self) -> float:
        """Arrival time of the next submitted request not dispatched yet (inf: none)."""
        return self.heap[0][0] if self.heap else math.inf

    @property
    def exhausted(self) -> bool:
        """Every group has been submitted and dispatched."""
        return not self.pending and not self.heap

    def pop_at(self, t_s: float) -> list[int]:
        """The submitted requests that arrive at ``t_s``, in request order."""
        out = []
        while self.heap and self.heap[0][0] == t_s:
            out.append(heapq.heappop(self.heap)[1])
        return out

    def finished(self, done: list[int], finish_s: list[float]) -> None:
        """Requests that finished (``finish_s`` per request): count the groups they complete
        and submit one waiting group per completion, at that time."""
        left, rank_of = self.left, self.rank_of
        for i in done:
            g = rank_of[i]
            left[g] -= 1
            if left[g]:
                continue
            t = finish_s[i]
            self.completed += 1
            self.completed_at.append(t)
            if self.pending:
                for j in self.members[self.pending.popleft()]:
                    heapq.heappush(self.heap, (max(t, self.arrival[j]), j))
        done.clear()

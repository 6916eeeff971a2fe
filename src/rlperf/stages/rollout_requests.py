"""Inputs of a rollout call: the requests (aligned arrays) and the engine's run options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import Field

from rlperf.errors import SpecError
from rlperf.specs.base import Spec

Dispatch = Literal["round_robin", "least_loaded", "round_robin_requests"]


@dataclass(frozen=True, eq=False)
class RolloutRequests:
    """Requests of one rollout call, one entry per request (read-only int64/float64 arrays).

    A request of group ``g`` shares its prompt with the other requests of ``g`` (GRPO's ``n``
    samples of one prompt). ``already_generated`` tokens were generated in an earlier call
    (partial rollout); their KV is gone and is re-prefilled with the prompt, unless
    ``kv_cached``: the request was decoding when the earlier call stopped and no weight update
    came between, so its KV is still on the engine and it goes on decoding without a prefill
    (rlperf.stages.rollout_engine.Replica.resume). Build with :meth:`build`, which validates.
    """

    prompt_tokens: np.ndarray
    response_tokens: np.ndarray  # final response length (what the request generates in total)
    group_id: np.ndarray
    already_generated: np.ndarray
    arrival_s: np.ndarray
    kv_cached: np.ndarray  # bool: KV of prompt + already_generated still cached (no re-prefill)
    groups: GroupIndex  # group_id sorted once (the input check, the dispatch and the run-out read it)

    @classmethod
    def build(
        cls,
        prompt_tokens: ArrayLike,
        response_tokens: ArrayLike,
        group_id: ArrayLike | None = None,
        already_generated: ArrayLike | None = None,
        arrival_s: ArrayLike | None = None,
        kv_cached: ArrayLike | None = None,
    ) -> RolloutRequests:
        """Validate and freeze. Defaults: one group per request, nothing generated, all at t=0,
        no KV cached."""
        prompt = _ints("requests.prompt_tokens", prompt_tokens)
        n = len(prompt)
        resp = _ints("requests.response_tokens", response_tokens, n)
        group = (
            np.arange(n, dtype=np.int64)
            if group_id is None
            else _ints("requests.group_id", group_id, n)
        )
        done = (
            np.zeros(n, np.int64)
            if already_generated is None
            else _ints("requests.already_generated", already_generated, n)
        )
        arr = (
            np.zeros(n)
            if arrival_s is None
            else np.asarray(arrival_s, dtype=np.float64).reshape(-1).copy()
        )
        if len(arr) != n:
            raise SpecError("requests.arrival_s", f"has {len(arr)} entries for {n} requests")
        cached = np.zeros(n, bool) if kv_cached is None else np.asarray(kv_cached, bool).reshape(-1).copy()
        if len(cached) != n:
            raise SpecError("requests.kv_cached", f"has {len(cached)} entries for {n} requests")
        if n == 0:
            raise SpecError("requests", "no requests")
        _check("requests.prompt_tokens", prompt >= 1, "must be >= 1")
        _check("requests.response_tokens", resp >= 1, "must be >= 1")
        _check(
            "requests.already_generated",
            (done >= 0) & (done < resp),
            "must be in [0, response_tokens)",
        )
        _check("requests.arrival_s", np.isfinite(arr) & (arr >= 0), "must be finite and >= 0")
        _check("requests.kv_cached", ~cached | ((done > 0) & (arr == 0)),
               "only for a request with already_generated > 0 that arrives at 0 s")
        groups = GroupIndex.of(group)
        _check_group_prompts(prompt, group, groups)
        for a in (prompt, resp, group, done, arr, cached, groups.ids, groups.first, groups.inverse):
            a.setflags(write=False)
        return cls(prompt, resp, group, done, arr, cached, groups)

    @property
    def num_requests(self) -> int:
        return int(len(self.prompt_tokens))

    @property
    def remaining_tokens(self) -> np.ndarray:
        return np.asarray(self.response_tokens - self.already_generated, np.int64)


def _ints(name: str, values: ArrayLike, n: int | None = None) -> np.ndarray:
    a = np.asarray(values).reshape(-1)
    if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise SpecError(name, f"must hold integers, got {a.dtype}")
    a = a.astype(np.int64, copy=True)
    if n is not None and len(a) != n:
        raise SpecError(name, f"has {len(a)} entries for {n} requests")
    return a


@dataclass(frozen=True, eq=False)
class GroupIndex:
    """The groups of a call's requests: ``ids`` the distinct group ids ascending, ``first``
    the first request of each, ``inverse`` each request's position in ``ids``
    (``np.unique``'s three answers; one stable sort, shared by everything that reads groups)."""

    ids: np.ndarray
    first: np.ndarray
    inverse: np.ndarray

    @classmethod
    def of(cls, group: np.ndarray) -> GroupIndex:
        ids, first, inverse = np.unique(group, return_index=True, return_inverse=True)
        return cls(ids, first, inverse.reshape(-1))

    def round_robin_slots(self, num_replicas: int) -> np.ndarray:
        """Each request's replica under round-robin dispatch: groups ranked by first
        appearance, request i to its group's rank mod replicas."""
        rank = np.empty(len(self.first), np.int64)
        rank[np.argsort(self.first, kind="stable")] = np.arange(len(self.first))
        return np.asarray(rank[self.inverse] % num_replicas, np.int64)


def _check_group_prompts(prompt: np.ndarray, group: np.ndarray, groups: GroupIndex) -> None:
    """Requests of one group answer one prompt, so their prompt lengths must agree: each
    request's prompt equals its group's first request's (the error names the first clash in
    (group, prompt) order)."""
    if np.array_equal(prompt, prompt[groups.first][groups.inverse]):
        return
    order = np.lexsort((prompt, group))
    g, p = group[order], prompt[order]
    bad = (g[1:] == g[:-1]) & (p[1:] != p[:-1])
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        raise SpecError(
            f"requests.prompt_tokens[{int(order[k + 1])}]",
            f"group {int(g[k])} has prompts of {int(p[k])} and {int(p[k + 1])} tokens; a group shares one prompt",
        )


def _check(name: str, ok: np.ndarray, problem: str) -> None:
    if not np.all(ok):
        i = int(np.flatnonzero(~ok)[0])
        raise SpecError(f"{name}[{i}]", problem)


class RolloutOptions(Spec):
    """How a rollout call is dispatched and when it stops."""

    dispatch: Dispatch = "round_robin"
    """round_robin: group g (in order of first appearance) goes to replica g mod R, so a group
    stays on one replica, as when a batch is split in contiguous chunks over the data-parallel
    engine ranks (verl's SPMD rollout, groups repeated interleaved); least_loaded: a new group
    goes to the replica with the fewest unfinished requests at its arrival (ties: lowest index);
    round_robin_requests: the k-th request submitted in the call (arrival order, then the order
    a group gate submits them) goes to replica k mod R, so a group's requests spread over the
    replicas, as verl's async agent loop sends them: ``AsyncLLMServerManager._choose_server``
    gives each new request id the server with the lowest request count and increments it, a
    count that is never decremented (round-robin over requests; verl/experimental/agent_loop/
    agent_loop.py at b25bb7d, the fully-async recipe's agent loop draws a fresh request id per
    run). verl keeps one counter per agent-loop worker and over the whole run; here one counter
    per call."""
    token_budget_per_request: int | None = Field(default=None, gt=0)
    """Partial rollout (Kimi k1.5): a request generates at most this many new tokens in this
    call and is returned unfinished if its response is longer."""
    time_limit_s: float | None = Field(default=None, gt=0)
    """Stop at this time; requests still queued or running are returned with their counts."""
    stop_after_num_finished: int | None = Field(default=None, gt=0)
    """Stop as soon as this many requests have finished (active partial rollout, APRIL)."""
    max_groups_in_flight: int | None = Field(default=None, gt=0)
    """Group admission (verl fully-async rollouter): the driver submits a group's requests
    together and keeps at most this many groups in flight; the next group (in order of first
    appearance) is submitted when one has all its requests finished
    (:mod:`rlperf.stages.rollout_groups`). None: every request is submitted at its arrival."""
    stop_after_num_groups: int | None = Field(default=None, gt=0)
    """Stop as soon as this many groups have all their requests finished (a trainer that takes
    whole groups)."""
    cuda_graphs: bool = True
    """Decode steps replay CUDA graphs (vLLM and SGLang default): the launch floor uses the
    profile's graph_kernel_launch_s instead of kernel_launch_s."""
    debug_checks: bool = False
    """Recompute KV usage from scratch and assert capacity and token invariants at every event."""
    event_by_event: bool = False
    """The reference path: advance the replicas event by event in global time order to the end,
    even once nothing outside can reach them (the run-out gives the same result, faster; tests
    compare the two)."""

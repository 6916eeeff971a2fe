"""Rollout stage: generation on ``replicas`` vLLM/SGLang-like engines, at request granularity.

:func:`simulate_rollout` dispatches requests to replicas (round-robin by group or by request,
or least loaded), runs continuous batching on each (:mod:`rlperf.stages.rollout_engine`) with the
closed-form step costs of :mod:`rlperf.stages.rollout_step`, and returns a
:class:`RolloutResult`. An engine with ``batching="static"`` runs fixed batches instead
(:mod:`rlperf.stages.rollout_static`). Replicas are advanced by one event heap in time order, so arrivals
(streaming, async RL), least-loaded dispatch and early stops see a consistent global clock.

Cost grows with the number of requests: each request causes O(1) events (admission, join,
completion; plus preemptions), each a few closed-form evaluations. Once every request has
arrived, the replicas are independent and finish (or reach the stop) in a few vectorized
passes (:mod:`rlperf.stages.rollout_runout`), with the same result.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import numpy as np

from rlperf.cost.memory import check_kv_capacity, inference_memory
from rlperf.errors import SpecError
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, check_engine_layout
from rlperf.stages.rollout_engine import Book, BookArrays, Queues, Replica, ReplicaStats
from rlperf.stages.rollout_groups import GroupGate
from rlperf.stages.rollout_requests import RolloutOptions, RolloutRequests
from rlperf.stages.rollout_runout import compiled, run_out, run_out_until
from rlperf.stages.rollout_result import (
    RolloutResult,
    TimelineSegment,
    low_occupancy_s,
    tail_after_fraction_s,
)
from rlperf.stages.rollout_static import StaticReplica, run_static
from rlperf.stages.rollout_step import StepModel

__all__ = [
    "RolloutOptions",
    "RolloutRequests",
    "RolloutResult",
    "TimelineSegment",
    "kv_capacity_tokens",
    "simulate_rollout",
    "solo_times_s",
]


def kv_capacity_tokens(
    model: ModelSpec, cluster: Cluster, layout: EngineLayout, min_tokens: int = 1
) -> int:
    """KV-cache capacity of one replica in tokens, from the memory model; SpecError when the
    engine cannot hold ``min_tokens`` (e.g. one sequence of the longest prompt + response)."""
    mem = inference_memory(model, layout, cluster.accelerator.device_memory_bytes)
    check_kv_capacity(mem, "engine", min_tokens)
    return mem.kv_capacity_tokens


def simulate_rollout(
    model: ModelSpec,
    cluster: Cluster,
    layout: EngineLayout,
    requests: RolloutRequests,
    options: RolloutOptions | None = None,
    kv_capacity: int | None = None,
    step: StepModel | None = None,
) -> RolloutResult:
    """Simulate one rollout call. ``kv_capacity`` (tokens per replica) overrides the memory
    model's figure. ``step``: the replica's step model (:meth:`StepModel.build` of ``model``,
    ``cluster``, ``layout`` and the options' CUDA graphs), when the caller keeps one for many
    calls of one engine (its memoized per-run coefficients carry over); built here otherwise."""
    opts = options or RolloutOptions()
    _check_inputs(model, cluster, layout)
    target = _targets(requests, opts)
    longest = int(np.max(requests.prompt_tokens + target))
    cap = (
        kv_capacity
        if kv_capacity is not None
        else kv_capacity_tokens(model, cluster, layout, longest)
    )
    _check_fits(requests, target, cap)
    if step is None:
        step = StepModel.build(model, cluster, layout, opts.cuda_graphs and layout.cuda_graphs)
    if layout.batching == "static":
        _check_static(opts)
        reps = [StaticReplica(r) for r in range(layout.replicas)]
        choose = _dispatcher(requests, opts, reps, _slots(requests, opts, len(reps)))
        out = run_static(step, requests, target, layout.max_num_seqs, cap, reps, choose)
        return _result(step, layout, requests, target, out.stats, out.finish_s, target, out.replica_of, math.inf)
    initial = BookArrays(requests.prompt_tokens, requests.response_tokens, target, requests.already_generated,
                         requests.group_id)
    book = Book(initial, requests.groups)
    replicas = [
        Replica(
            r,
            step,
            book,
            cap,
            layout.max_num_seqs,
            layout.max_num_batched_tokens,
            layout.prefix_sharing,
        )
        for r in range(layout.replicas)
    ]
    replica_of = np.full(requests.num_requests, -1, np.int64)
    t_stop = _drive(replicas, book, requests, opts, replica_of, initial)
    stats = [r.stats for r in replicas]
    if book.settled is not None:
        return _result(step, layout, requests, target, stats, book.settled.finish_s, book.settled.generated,
                       replica_of, t_stop)
    return _result(step, layout, requests, target, stats, book.finish_array(), np.array(book.generated, np.int64),
                   replica_of, t_stop)


# ---------------------------------------------------------------------- validation
def _check_inputs(model: ModelSpec, cluster: Cluster, layout: EngineLayout) -> None:
    check_engine_layout(model, layout)
    if layout.num_gpus > cluster.num_gpus:
        raise SpecError(
            "engine.replicas", f"{layout.num_gpus} GPUs needed, cluster has {cluster.num_gpus}"
        )
    if layout.max_num_batched_tokens < layout.max_num_seqs:
        raise SpecError(
            "engine.max_num_batched_tokens",
            f"{layout.max_num_batched_tokens} is below max_num_seqs ({layout.max_num_seqs})",
            f">= {layout.max_num_seqs}",
        )


def _check_static(opts: RolloutOptions) -> None:
    for name in ("time_limit_s", "stop_after_num_finished", "max_groups_in_flight", "stop_after_num_groups"):
        if getattr(opts, name) is not None:
            raise SpecError(f"options.{name}", "a static-batching engine runs whole batches and cannot stop early",
                            "engine.batching: continuous")


def _targets(requests: RolloutRequests, opts: RolloutOptions) -> np.ndarray:
    resp = np.asarray(requests.response_tokens, np.int64)
    if opts.token_budget_per_request is None:
        return np.array(resp, np.int64)
    return np.asarray(
        np.minimum(resp, requests.already_generated + opts.token_budget_per_request), np.int64
    )


def _check_fits(requests: RolloutRequests, target: np.ndarray, cap: int) -> None:
    need = requests.prompt_tokens + target
    worst = int(np.argmax(need))
    if need[worst] > cap:
        raise SpecError(
            f"requests[{worst}]",
            f"needs {int(need[worst])} tokens of KV cache alone; a replica holds {cap}",
            "shorter requests, a larger engine (tp/pp) or more gpu_memory_utilization",
        )


# ---------------------------------------------------------------------- the event loop
class _Dispatchable(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def load(self) -> int: ...


R = TypeVar("R", bound=_Dispatchable)


class _RequestRoundRobin(Generic[R]):
    """``choose`` of round_robin_requests: the k-th request asked for goes to replica k mod R
    (the driver asks in submission order)."""

    def __init__(self, replicas: list[R]) -> None:
        self.replicas = replicas
        self.count = 0

    def __call__(self, i: int) -> R:
        r = self.replicas[self.count % len(self.replicas)]
        self.count += 1
        return r


class _GroupRoundRobin(Generic[R]):
    """``choose`` of round_robin: request i to replica ``slots[i]``
    (:meth:`GroupIndex.round_robin_slots`; read as a list once asked, for scalar access)."""

    def __init__(self, replicas: list[R], slots: np.ndarray) -> None:
        self.replicas = replicas
        self.slots = slots
        self.slot: list[int] | None = None

    def __call__(self, i: int) -> R:
        if self.slot is None:
            self.slot = self.slots.tolist()
        return self.replicas[self.slot[i]]


def _slots(requests: RolloutRequests, opts: RolloutOptions, num_replicas: int) -> np.ndarray | None:
    """Each request's replica under round_robin dispatch (None under the others)."""
    return requests.groups.round_robin_slots(num_replicas) if opts.dispatch == "round_robin" else None


def _dispatcher(requests: RolloutRequests, opts: RolloutOptions, replicas: list[R],
                slots: np.ndarray | None) -> Callable[[int], R]:
    """Return ``choose(i) -> replica`` for request ``i``; groups stay on one replica, except
    under round_robin_requests (one replica per request, in the order asked). ``slots``:
    :func:`_slots`."""
    groups = requests.group_id
    if opts.dispatch == "round_robin":
        assert slots is not None
        return _GroupRoundRobin(replicas, slots)
    if opts.dispatch == "round_robin_requests":
        return _RequestRoundRobin(replicas)
    home: dict[int, R] = {}

    def least_loaded(i: int) -> R:
        g = int(groups[i])
        r = home.get(g)
        if r is None:
            r = min(replicas, key=lambda x: (x.load, x.index))
            home[g] = r
        return r

    return least_loaded


def _enqueue(replicas: list[Replica], ids: np.ndarray, slots: np.ndarray) -> list[Replica]:
    """Append requests ``ids`` (in order) to the waiting queues of replicas ``slots``, as one
    ``choose`` and ``append`` per request would; return the replicas in order of first use."""
    used, first = np.unique(slots, return_index=True)
    by = np.argsort(slots, kind="stable")
    bounds = np.searchsorted(slots[by], used, "right").tolist()
    lo = 0
    for u, hi in zip(used.tolist(), bounds):
        replicas[u].waiting.extend(ids[by[lo:hi]].tolist())
        lo = hi
    return [replicas[u] for u in used[np.argsort(first)].tolist()]


def _submit(ids: list[int], choose: Callable[[int], Replica], arrived: list[int], went_to: list[int],
            touched: list[Replica]) -> list[Replica]:
    """Queue requests ``ids``, in order, on the replicas ``choose`` gives, noting each one's
    replica in ``arrived`` / ``went_to``; return ``touched`` and the replicas newly used, in
    order of first use."""
    seen = {r.index: r for r in touched}
    for i in ids:
        r = choose(i)
        r.waiting.append(i)
        arrived.append(i)
        went_to.append(r.index)
        seen.setdefault(r.index, r)
    return list(seen.values())


def _resume_cached(replicas: list[Replica], cached: list[bool]) -> None:
    """The requests at the head of each replica's queue whose KV is still cached join its
    decoding batch without a prefill (:meth:`Replica.resume`), as long as they fit; the rest
    wait and are re-prefilled. Before the replicas are planned, so the Python and the compiled
    run-out start from the same state."""
    for r in replicas:
        while r.plan is None and r.waiting and cached[r.waiting[0]] and r.resume(r.waiting[0]):
            pass


def _drive(
    replicas: list[Replica],
    book: Book,
    requests: RolloutRequests,
    opts: RolloutOptions,
    replica_of: np.ndarray,
    initial: BookArrays | None = None,
) -> float:
    """Run the replicas in global time order; return the stop time (inf if none). With group
    admission (:mod:`rlperf.stages.rollout_groups`) the requests of a group arrive when the
    driver submits it, and finishes are reported to the gate as they happen. ``initial``: the
    book's arrays as built, which the compiled run-out reads when it plans the first arrivals."""
    slots = _slots(requests, opts, len(replicas))
    choose = _dispatcher(requests, opts, replicas, slots)
    arrival = requests.arrival_s
    gated = opts.max_groups_in_flight is not None or opts.stop_after_num_groups is not None
    gate = GroupGate(requests.group_id, arrival, opts.max_groups_in_flight) if gated else None
    if gate is None:
        order_arr = np.argsort(arrival, kind="stable")
    else:  # the groups submitted at the start; the others arrive through the gate
        first = np.array(gate.initial(), np.int64)
        order_arr = first[np.argsort(arrival[first], kind="stable")]
    n = len(order_arr)
    in_order = arrival[order_arr]
    # Every request at one time (a synchronous call): only the first entry is ever read.
    same = n > 0 and in_order[0] == in_order[-1]
    arrival_sorted: list[float] = [float(in_order[0])] * n if same else in_order.tolist()
    t_stop = opts.time_limit_s if opts.time_limit_s is not None else math.inf
    want = opts.stop_after_num_finished
    want_groups = opts.stop_after_num_groups
    debug = opts.debug_checks
    version = [0] * len(replicas)
    heap: list[tuple[float, int, int]] = []
    ptr = 0
    arrived: list[int] = []  # requests dispatched, and the replica of each (replica_of at the end)
    went_to: list[int] = []
    if gate is not None:
        book.done_log = []
    # Requests whose KV is still cached (they arrive at 0 s, first in the batch) go on decoding.
    cached_arr = requests.kv_cached if requests.kv_cached.any() else None
    cached: list[bool] | None = None  # cached_arr as a list, made when the event loop resumes requests
    queues: Queues | None = None  # the first arrivals' queues, when they go straight to the compiled run-out
    run_out_compiled = not opts.event_by_event and not debug and compiled()

    def replan(r: Replica) -> None:
        r.events()
        if debug:
            r.check()
        end = r.plan_next()
        version[r.index] += 1
        if end < math.inf:
            heapq.heappush(heap, (end, r.index, version[r.index]))

    def groups_done() -> float:
        """Report finishes to the gate; the time the stop's group completed (inf: not yet)."""
        assert gate is not None and book.done_log is not None
        gate.finished(book.done_log, book.finish_s)
        if want_groups is not None and gate.completed >= want_groups:
            return gate.completed_at[want_groups - 1]
        return math.inf

    while True:
        if ptr == n and not opts.event_by_event and (gate is None or (gate.exhausted and want_groups is None)):
            # Every request has arrived: no replica can affect another any more, so each runs
            # out on its own (same result, faster), up to the stop if one is set.
            book.done_log = None
            if t_stop == math.inf and want is None:
                run_out(replicas, debug)
            else:
                t_stop = run_out_until(replicas, t_stop, want, debug)
            break
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        t_arr = arrival_sorted[ptr] if ptr < n else math.inf
        if gate is not None:
            t_arr = min(t_arr, gate.next_s)
        t_rep = heap[0][0] if heap else math.inf
        t_next = min(t_arr, t_rep)
        if t_next > t_stop or t_next == math.inf:
            break
        if t_arr <= t_rep:
            as_built = initial if ptr == 0 else None  # nothing has arrived, so nothing has run
            end = bisect_right(arrival_sorted, t_arr, ptr)  # the requests arriving now
            if slots is not None and end - ptr > 16:  # many at once (every request at t = 0)
                ids = order_arr[ptr:end]
                to = slots[ids]
                replica_of[ids] = to
                if as_built is not None and end == n and gate is None and run_out_compiled:
                    # Every request at once on replicas that have queued nothing: their queues
                    # go to the compiled run-out as one array (_enqueue's order), not deques.
                    queues = Queues(ids[np.argsort(to, kind="stable")], np.bincount(to, minlength=len(replicas)))
                    counts = queues.counts.tolist()
                    touched = [r for r in replicas if counts[r.index]]
                else:
                    touched = _enqueue(replicas, ids, to)
                ptr = end
            else:
                touched = _submit(order_arr[ptr:end].tolist(), choose, arrived, went_to, [])
                ptr = end
            # The last requests have arrived on idle replicas: the compiled run-out applies
            # their events too (the same as replanning them here, then running out), and
            # resumes the cached ones first.
            out_compiled = gate is None and ptr == n and run_out_compiled and all(r.plan is None for r in touched)
            if cached_arr is not None and not out_compiled:
                if cached is None:
                    cached = cached_arr.tolist()
                _resume_cached(touched, cached)
            if gate is not None:  # groups the gate submits now, after the ones queued at the start
                touched = _submit(gate.pop_at(t_arr), choose, arrived, went_to, touched)
            elif out_compiled:
                for r in touched:
                    r.t = max(r.t, t_arr)
                fresh = frozenset(r.index for r in touched)
                if t_stop == math.inf and want is None:
                    run_out(replicas, debug, fresh, cached_arr, as_built, queues)
                else:
                    t_stop = run_out_until(replicas, t_stop, want, debug, fresh, cached_arr, as_built, queues)
                break
            for r in touched:
                if r.plan is None:
                    r.t = max(r.t, t_arr)
                    replan(r)
                elif r.could_admit():
                    r.run_until(t_arr, round_up=True)
                    replan(r)
            if gate is not None:
                t_stop = min(t_stop, groups_done())
        else:
            _, idx, _ = heapq.heappop(heap)
            r = replicas[idx]
            r.commit(r.plan_n)
            replan(r)
            if want is not None and book.num_finished >= want:
                t_stop = min(t_stop, r.t)
            if gate is not None:
                t_stop = min(t_stop, groups_done())
    book.done_log = None
    if arrived:
        replica_of[arrived] = went_to
    if book.settled is not None:  # the compiled run-out committed and settled the stop itself
        return t_stop if t_stop < math.inf and book.settled.cut else math.inf
    unsent = ptr < n or (gate is not None and not gate.exhausted)
    stopped = t_stop < math.inf and (unsent or any(r.plan is not None for r in replicas))
    if stopped:
        for r in replicas:
            r.run_until(t_stop, round_up=False)
            r.settle_stopped()
    return t_stop if stopped else math.inf


# ---------------------------------------------------------------------- results
def solo_times_s(
    step: StepModel, context_tokens: np.ndarray, decode_steps: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """(prefill, decode) time of each request alone on a replica at batch 1: prefill of
    ``context_tokens`` in chunks of ``budget``, then ``decode_steps`` steps from there."""
    # All requests at once: the array forms of prefill_s_per_token, run and Run.time_s do the
    # same operations elementwise (the run-out's timing relies on it too). A few requests are
    # costed one by one on the scalar forms instead: the array forms' ~150 numpy calls cost
    # ~0.4 ms whatever the size, a request ~10 µs (the planner's bound asks for one at a time).
    p = np.asarray(context_tokens, np.int64)
    r = np.asarray(decode_steps, np.int64)
    if p.ndim == 1 and p.size <= SOLO_SCALAR_MAX and p.min(initial=1) > 0:
        pairs = [_solo_s(step, pk, rk, budget) for pk, rk in zip(p.tolist(), r.tolist())]
        return np.array([x for x, _ in pairs], np.float64), np.array([y for _, y in pairs], np.float64)
    n_chunks = -(-p // budget)
    q = step.prefill_s_per_token(p, 0.5 * p * (p + 1), np.ones_like(p))
    zero, one = np.zeros_like(p), np.ones_like(p)
    pre = step.runs(zero, zero, p / n_chunks, q, one).time_s(n_chunks)  # a wave of one sequence
    dec = step.runs(one, p + 1, np.zeros(p.shape), np.zeros(p.shape), zero).time_s(r)
    return pre, dec


# Requests up to which solo_times_s costs each alone on the scalar forms.
SOLO_SCALAR_MAX = 32


def _solo_s(step: StepModel, context_tokens: int, decode_steps: int, budget: int) -> tuple[float, float]:
    """:func:`solo_times_s` of one request (``context_tokens`` > 0) on the scalar forms, in
    the same operations."""
    n_chunks = -(-context_tokens // budget)
    q = step.prefill_s_per_token(context_tokens, 0.5 * context_tokens * (context_tokens + 1), 1)
    pre = step.run(0, 0, context_tokens / n_chunks, q, 1).time_s(n_chunks)
    dec = step.run(1, context_tokens + 1, 0.0, 0.0, 0).time_s(decode_steps)
    return pre, dec


def _pareto(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points (x, y) not dominated in both coordinates (the max of any function
    increasing in both lies among them), by y then x descending, each once. Every point that
    is at most the highest point (max y, then max x) in x, or at most the rightmost (max x,
    then max y) in y, is dominated by it or equal to it: only the points beyond both, and the
    two, are sorted."""
    hi = int(np.argmax(y))
    top = x[y == y[hi]].max()
    rt = int(np.argmax(x))
    right = y[x == x[rt]].max()
    rest = (x > top) & (y > right)
    px = np.concatenate((x[rest], [top, x[rt]]))
    py = np.concatenate((y[rest], [y[hi], right]))
    idx = np.lexsort((-px, -py))  # by y desc, then x desc
    best = np.maximum.accumulate(px[idx])
    keep = np.ones(len(idx), bool)
    keep[1:] = px[idx][1:] > best[:-1]
    return px[idx[keep]], py[idx[keep]]


def _depth(
    step: StepModel, requests: RolloutRequests, target: np.ndarray, budget: int
) -> tuple[float, float]:
    ctx = requests.prompt_tokens + requests.already_generated
    steps = target - requests.already_generated - 1  # the first token comes from the prefill
    front_ctx, front_steps = _pareto(ctx, steps)
    pre, dec = solo_times_s(step, front_ctx, front_steps, budget)
    return float(np.max(pre + dec)), float(np.max(dec))


def _result(
    step: StepModel,
    layout: EngineLayout,
    requests: RolloutRequests,
    target: np.ndarray,
    stats: list[ReplicaStats],
    finish: np.ndarray,
    generated: np.ndarray,
    replica_of: np.ndarray,
    t_stop: float,
) -> RolloutResult:
    finished = generated == requests.response_tokens
    rep_finish = np.array([s.last_end_s for s in stats])
    makespan = t_stop if t_stop < math.inf else float(max(rep_finish.max(), 0.0))
    crit = int(np.argmax(rep_finish))
    crit_segs = stats[crit].segments
    depth, decode_depth = _depth(step, requests, target, layout.max_num_batched_tokens)
    gpus = layout.gpus_per_replica
    return RolloutResult(
        makespan_s=makespan,
        stopped_early=t_stop < math.inf,
        finish_time_s=finish,
        generated_tokens=generated,
        finished=finished,
        replica_of=replica_of,
        replica_busy_s=np.array([s.busy_s for s in stats]),
        replica_finish_s=rep_finish,
        num_prefill_tokens=sum(s.prefill_tokens for s in stats),
        num_decode_tokens=sum(s.decode_tokens for s in stats),
        num_steps=sum(s.num_steps for s in stats),
        num_preemptions=sum(s.preemptions for s in stats),
        tail_s=tail_after_fraction_s(finish, makespan),
        critical_replica=crit,
        below_25pct_slots_s=low_occupancy_s(
            crit_segs, rep_finish[crit], 0.25 * layout.max_num_seqs
        ),
        below_10pct_slots_s=low_occupancy_s(
            crit_segs, rep_finish[crit], 0.10 * layout.max_num_seqs
        ),
        total_flops=sum(s.flops for s in stats),
        total_hbm_bytes=sum(s.bytes_per_gpu for s in stats) * layout.tp,
        work_s=sum(s.roofline_s for s in stats) * gpus,
        depth_s=depth,
        decode_depth_s=decode_depth,
        num_gpus=layout.num_gpus,
        gpus_per_replica=gpus,
        timeline=tuple(s.segments for s in stats),
    )

"""Replicas that nothing outside can reach any more, run to the end in a few vectorized passes.

Once every request of a rollout call has arrived and no stop is set, the replicas no longer
affect one another, and which request runs in which step depends on step counts only, never
on times. :func:`run_out` then gives the same result as committing and replanning event by
event (:mod:`rlperf.stages.rollout`), at a fraction of the cost:

1. each replica plans its runs on integers (:meth:`Replica.plan_out`), event by event while
   requests are still admitted;
2. :func:`drain` finishes, all at once, the replicas left with their decoding batch alone:
   every later event is a completion at a known step, so the runs are the gaps between the
   distinct finish steps, the batch shrinking by the requests that leave at each (unless the
   KV cache would overflow on the way: such a replica goes on event by event);
3. :func:`time_runs` times every run of every replica in one pass (the closed forms of
   :mod:`rlperf.stages.rollout_step` on arrays), then adds up each replica's figures in run
   order, as the event-by-event path does.

With a stop set (a time limit, or a number of requests finished), :func:`run_out_until`
plans and times the replicas batch by batch, the one furthest behind in time first, until
the stop is known, and sets back the replicas that went past it: the same result as the
event-by-event path, which times every event as it goes (2-3x the cost).
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from rlperf.stages.jit import compiled as loops_compiled
from rlperf.stages.request_status import DECODING, DONE
from rlperf.stages.rollout_engine import Replica, RunArrays, RunLog, Settled, run_totals
from rlperf.stages.rollout_step import Runs, StepModel

if TYPE_CHECKING:
    from rlperf.stages.rollout_engine import BookArrays, Queues
    from rlperf.stages.rollout_kernel import CallPlanner, Planned


@dataclass(frozen=True)
class Drained:
    """The runs :func:`drain` found (arrays, one entry per run, each replica's in run order)
    and the requests that finished at the end of each."""

    replica: np.ndarray  # Replica.index of the run's replica
    num_decode: np.ndarray
    context: np.ndarray  # total context at the run's first step
    num_steps: np.ndarray
    requests: np.ndarray  # the drained requests, run after run
    run_of: np.ndarray  # for each of them, its run (index into the arrays above)


def compiled() -> bool:
    """True when :func:`run_out` plans with the compiled loop (the loops run as machine code,
    :func:`rlperf.stages.jit.compiled`, and :data:`COMPILED` is on)."""
    return COMPILED and loops_compiled()


def run_out(replicas: list[Replica], debug: bool = False, fresh: frozenset[int] = frozenset(),
            cached: np.ndarray | None = None, initial: BookArrays | None = None, queues: Queues | None = None) -> None:
    """Run every replica with a planned run until idle (``debug``: check the invariants at
    every event). The replicas whose index is in ``fresh`` (only with :func:`compiled`) have
    requests just queued and no plan yet: they apply their events first, as
    :meth:`Replica.events` would, after resuming the requests at the head of their queues
    whose KV is ``cached`` (``initial``: the book's arrays when nothing has run yet;
    ``queues``: the queues as arrays when the replicas' own are empty;
    rlperf.stages.rollout_kernel.CallPlanner)."""
    active = [r for r in replicas if r.plan is not None or r.index in fresh]
    if not active:
        return
    if not debug and compiled():
        from rlperf.stages.rollout_kernel import CallPlanner

        _settle_idle(active, CallPlanner(active, fresh, cached, initial, queues))
        return
    assert not fresh and cached is None and queues is None
    for r in active:
        r.log = RunLog()
    todo, may_drain, drained = active, True, []
    while todo:
        ready = [r for r in todo if r.plan_out(may_drain, debug)]  # the rest went idle
        drained.append(drain(ready, debug))
        finished = set(drained[-1].replica.tolist())
        todo = [r for r in ready if r.index not in finished]  # their KV cache would overflow
        may_drain = False  # a replica the drain sent back must admit again before retrying
    time_runs(active, drained)
    for r in active:
        r.log = None


# Plan the run-out with the compiled loop (rlperf.stages.rollout_kernel) where numba is
# installed; False: the Python loop and drain below (the reference the tests compare against).
COMPILED = True

# Runs per replica of the compiled run-out's first dry run to a stop (then 4x, 16x, ...): a
# stop often comes long before the call's end (a stream stops after a fraction finished).
DRY_RUNS = 2048

# A stop after ``k`` more finished requests on ``r`` replicas: the first dry run plans
# ``RUNS_PER_FINISH·k/r + 32`` runs per replica instead (when fewer than DRY_RUNS). A replica's
# run ends at its next event (a completion, a wave joining, a preemption), so a replica reaches
# its share ``k/r`` of the finished requests after about twice as many runs; the busiest
# replica of the README question's 152 stopped calls needed 1.0-2.6x its share (median 1.8).
# Only the work changes: a dry run too short is followed by a longer one (4x) as before, and
# the stop and the runs before it do not depend on how far a dry run went.
RUNS_PER_FINISH = 2.75

# Runs planned per replica between two looks at the clock in :func:`run_out_until`: the runs
# planned past the stop are planned again, so a batch bounds the waste; each batch costs a
# snapshot of the replica's state (a few list copies).
STOP_BATCH_RUNS = 1024


def run_out_until(replicas: list[Replica], t_stop: float, want: int | None, debug: bool = False,
                  fresh: frozenset[int] = frozenset(), cached: np.ndarray | None = None,
                  initial: BookArrays | None = None, queues: Queues | None = None) -> float:
    """Run the replicas (every request arrived) up to a stop: ``t_stop``, or the time the
    ``want``-th request has finished its whole response, whichever comes first; return it (or
    ``t_stop`` if the replicas go idle first). The replicas are left as the event-by-event
    path leaves them when its clock passes the stop: every run that ends at or before it done
    (its events applied) and the run in progress planned (:meth:`Replica.plan_next`).

    Round after round, the busy replica furthest behind in time plans up to
    :data:`STOP_BATCH_RUNS` runs on integers and times them (:func:`time_runs`). Every event
    up to the earliest end of a busy replica is then known, and so is the stop once it lies
    there. It lies after the start of every replica's last batch (the batch started at the
    earliest end of its round, and fewer than ``want`` requests had finished by then), so
    the replicas that went past it are set back to their last batch's start and plan again
    the runs that end by it. With :func:`compiled` (``fresh``, ``cached``, ``initial`` and
    ``queues`` as in :func:`run_out`),
    :func:`_run_out_until_compiled` gives the same result."""
    if not debug and compiled():
        return _run_out_until_compiled(replicas, t_stop, want, fresh, cached, initial, queues)
    assert not fresh and cached is None and queues is None
    book = replicas[0].book
    need = None if want is None or book.num_finished >= want else want - book.num_finished
    full_s: list[float] = []  # finish times of the requests planned to finish whole
    last: dict[int, _Saved] = {}  # each replica's state before its last batch
    while True:
        busy = [r for r in replicas if r.busy]
        known = min((r.t for r in busy), default=math.inf)  # every event up to here is planned
        stop = t_stop
        if need is not None and len(full_s) >= need:
            stop = min(stop, sorted(full_s)[need - 1])
        if stop <= known:
            break
        behind = [r for r in busy if r.t == known]
        for r in behind:
            last[r.index] = _Saved(r)
            r.log = RunLog()
            r.plan_out(False, debug, STOP_BATCH_RUNS)
        time_runs(behind, [drain([])])
        for r in behind:
            assert r.log is not None
            last[r.index].log = r.log
            full_s.extend(book.finish_s[i] for i in r.log.finished if book.generated[i] == book.response[i])
            r.log = None
    if stop == math.inf:
        return t_stop  # every replica went idle first
    for saved in last.values():
        r = saved.replica
        done = bisect_right(r.stats.segments.end_s, stop, lo=saved.num_segments) - saved.num_segments
        if done < len(saved.log.runs):
            saved.restore()
            if done:
                r.log = RunLog()
                r.plan_out(False, debug, done)
                time_runs([r], [drain([])])
                r.log = None
    for r in replicas:
        if r.busy:
            r.plan_next()
    return stop


_BOOK_FIELDS = ("generated", "status", "finish_s", "join_step", "private_kv", "order")


class _Saved:
    """One replica's state and its requests' entries in the book, to go back to (the requests
    it may touch: queued, prefilling, decoding)."""

    def __init__(self, r: Replica) -> None:
        self.replica = r
        self.log = RunLog()  # the runs planned from this state
        self.state = {k: (type(v)(v) if isinstance(v, (list, deque, dict)) else v) for k, v in vars(r).items()}
        self.stats = dataclasses.replace(r.stats)
        self.num_segments = len(r.stats.segments)
        bk = r.book
        self.requests = list({*r.waiting, *r.wave, *r.stack})
        get = itemgetter(*self.requests, 0)  # a tuple even for one request (the 0 is dropped)
        self.entries = [get(getattr(bk, f))[:-1] for f in _BOOK_FIELDS]

    def restore(self) -> None:
        r, bk = self.replica, self.replica.book
        bk.num_finished -= sum(bk.generated[i] == bk.response[i] for i in self.log.finished)
        for f, values in zip(_BOOK_FIELDS, self.entries):
            col = getattr(bk, f)
            for i, v in zip(self.requests, values):
                col[i] = v
        vars(r).update(self.state)
        seg = self.stats.segments  # the replica's: appended to since, cut back
        for c in (seg.start_s, seg.end_s, seg.batch_size, seg.prefill):
            del c[self.num_segments:]
        r.stats = self.stats


def drain(replicas: list[Replica], debug: bool = False) -> Drained:
    """Run out the ``replicas`` (each holding only decoding sequences: nothing waiting, no
    wave) whose KV cache suffices; the others are left as they are (they go on event by
    event)."""
    none = np.zeros(0, np.int64)
    if not replicas:
        return Drained(none, none, none, none, none, none)
    bk = replicas[0].book
    # Every live decoding request, ordered by (replica, finish step, join order): the order in
    # which events() would let them leave.
    rep = np.repeat(np.arange(len(replicas)), [len(r.heap) for r in replicas])
    flat = chain.from_iterable(chain.from_iterable(r.heap for r in replicas))
    stop, order, ids = np.fromiter(flat, np.int64, 3 * len(rep)).reshape(-1, 3).T

    def gather(values: list[int], at: np.ndarray) -> np.ndarray:
        """``values[at]`` for a list (the book keeps plain lists for its scalar updates): the
        whole list converted at once when ``at`` reads a good part of it (C speed), else item
        by item."""
        if 4 * len(at) >= len(values):
            whole: np.ndarray = np.asarray(values, np.int64)
            return whole[at]  # type: ignore[no-any-return]
        return np.fromiter(map(values.__getitem__, at.tolist()), np.int64, len(at))

    live = (gather(bk.status, ids) == DECODING) & (gather(bk.order, ids) == order)
    rep, stop, order, ids = rep[live], stop[live], order[live], ids[live]
    by = np.lexsort((order, stop, rep))
    rep, stop, ids = rep[by], stop[by], ids[by]
    prompt, generated = gather(bk.prompt, ids), gather(bk.generated, ids)
    join, private, group = gather(bk.join_step, ids), gather(bk.private_kv, ids), gather(bk.group, ids)
    # What each request takes off ctx_fixed and kv_fixed when it leaves (Replica._leave); the
    # last member of a group also frees the group's shared prompt.
    ctx = prompt + generated - join
    kv = private - join
    sharing = np.array([r.sharing for r in replicas])
    key = rep * (int(group.max()) + 1) + group
    last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]
    kv[last] += np.where(sharing[rep[last]], prompt[last], 0)

    # One run per distinct (replica, finish step), ending at that step.
    first = np.flatnonzero(np.r_[True, (rep[1:] != rep[:-1]) | (stop[1:] != stop[:-1])])
    run_rep, end = rep[first], stop[first]
    rep_first = np.searchsorted(run_rep, np.arange(len(replicas)))  # each replica's first run
    opening = np.zeros(len(first), bool)
    opening[rep_first] = True

    def before(per_run: np.ndarray) -> np.ndarray:
        """Sum of ``per_run`` over the replica's earlier runs (integers: exact)."""
        done = np.cumsum(per_run) - per_run
        return done - done[rep_first][run_rep]  # type: ignore[no-any-return]

    now = {k: np.array([getattr(r, k) for r in replicas], np.int64) for k in ("S", "b", "ctx_fixed", "kv_fixed", "cap")}
    leaving = np.diff(np.append(first, len(ids)))
    b = now["b"][run_rep] - before(leaving)
    ctx_fixed = now["ctx_fixed"][run_rep] - before(np.add.reduceat(ctx, first))
    kv_fixed = now["kv_fixed"][run_rep] - before(np.add.reduceat(kv, first))
    start = np.where(opening, now["S"][run_rep], np.r_[0, end[:-1]])
    # The requests are every decoding sequence and hold all of the KV cache in use.
    assert np.array_equal(np.bincount(rep, minlength=len(replicas)), now["b"])
    assert np.array_equal(np.bincount(rep, ctx, len(replicas)), now["ctx_fixed"])
    assert np.array_equal(np.bincount(rep, kv, len(replicas)), now["kv_fixed"])
    # A run reaches its finish step with no KV stop iff kv_fixed + b * end <= cap, i.e.
    # (cap - kv_used) // b >= end - start in Replica._plan_steps.
    fits = np.ones(len(replicas), bool)
    fits[run_rep[kv_fixed + b * end > now["cap"][run_rep]]] = False
    runs, reqs = fits[run_rep], fits[rep]

    # Every drained request leaves having generated up to its finish step (Replica._leave).
    final = generated + stop - join
    ids_list = ids[reqs].tolist()
    for i, g in zip(ids_list, final[reqs].tolist()):
        bk.generated[i] = g
        bk.status[i] = DONE
    bk.num_finished += int(np.sum(final[reqs] == gather(bk.response, ids[reqs])))
    last_end = np.maximum.reduceat(end, rep_first).tolist()
    decoded = np.bincount(run_rep, b * (end - start), len(replicas)).astype(np.int64).tolist()
    for k, r in enumerate(replicas):
        if not fits[k]:
            continue
        r.stats.decode_tokens += decoded[k]
        r.stats.num_steps += last_end[k] - r.S
        r.S = last_end[k]
        r.b = r.ctx_fixed = r.kv_fixed = 0
        r.heap.clear()
        r.stack.clear()
        r.group_resident.clear()
        r.blocked = False
        if debug:
            r.check()
    run_index = np.cumsum(runs) - 1  # position of each kept run among the kept runs
    indices = np.array([r.index for r in replicas], np.int64)
    return Drained(
        indices[run_rep[runs]], b[runs], (ctx_fixed + b * start)[runs], (end - start)[runs],
        ids[reqs], run_index[np.searchsorted(first, np.arange(len(ids)), "right") - 1][reqs],
    )


def time_runs(replicas: list[Replica], drained: list[Drained]) -> None:
    """Time the runs of ``replicas`` (all sharing one step model): the ones they logged, then
    the ones ``drained`` found. Give each replica the figures :meth:`Replica.commit` would
    have added up, run after run, and each finished request its time."""
    logs = [r.log for r in replicas if r.log is not None]
    assert len(logs) == len(replicas)
    at = {r.index: k for k, r in enumerate(replicas)}

    # Logged runs first, then drained ones (which prefill nothing: zero wave tokens, and the
    # per-token prefill figures only ever multiply them), sorted by replica (stable).
    # Every replica logged a run. One float64 array of all the runs' fields (one C pass; the
    # integer fields, step and token counts far below 2**53, come back exactly).
    num_logged = sum(len(log.runs) for log in logs)
    fields = chain.from_iterable(chain.from_iterable(log.runs for log in logs))
    cols = np.fromiter(fields, np.float64, 7 * num_logged).reshape(-1, 7).T
    logged = np.repeat(np.arange(len(logs)), [len(log.runs) for log in logs])
    d_rep = np.array([at[i] for i in np.concatenate([d.replica for d in drained]).tolist()], np.int64)
    zero = np.zeros(len(d_rep), np.int64)

    def joined(mine: np.ndarray, theirs: np.ndarray, dtype: type) -> np.ndarray:
        return np.concatenate((mine.astype(dtype), theirs.astype(dtype)))

    b = joined(cols[0], np.concatenate([d.num_decode for d in drained]), np.int64)
    ctx = joined(cols[1], np.concatenate([d.context for d in drained]), np.int64)
    n = joined(cols[2], np.concatenate([d.num_steps for d in drained]), np.int64)
    chunk, n_wave = joined(cols[3], zero, np.int64), joined(cols[4], zero, np.int64)
    wave_s, wave_flops = joined(cols[5], zero, np.float64), joined(cols[6], zero, np.float64)
    rep = np.concatenate((logged, d_rep))
    by = np.argsort(rep, kind="stable")
    end_s = _time(replicas, RunArrays(*(x[by] for x in (rep, b, ctx, n, chunk, n_wave, wave_s, wave_flops))))
    finish_s = replicas[0].book.finish_s
    bounds = np.searchsorted(rep[by], np.arange(len(replicas) + 1)).tolist()
    finished = list(chain.from_iterable(log.finished for log in logs))
    finished_run = [lo + np.repeat(np.arange(len(log.ends)), np.diff(log.ends, prepend=0)) for log, lo in zip(logs, bounds)]
    for i, v in zip(finished, end_s[np.concatenate(finished_run)].tolist() if finished else []):
        finish_s[i] = v
    # A drained run's place after the sort: where its index among all runs went.
    place = np.empty(len(by), np.int64)
    place[by] = np.arange(len(by))
    offset = len(logged)
    for d in drained:
        for i, v in zip(d.requests.tolist(), end_s[place[offset + d.run_of]].tolist()):
            finish_s[i] = v
        offset += len(d.num_steps)


def time_planned(replicas: list[Replica], planned: Planned, timed: _Timed | None = None,
                 finish_s: np.ndarray | None = None) -> None:
    """:func:`time_runs` for the runs :func:`rlperf.stages.rollout_kernel.plan_to_idle` planned
    (already in replica order); ``timed``: their step costs, when a dry run has them;
    ``finish_s``: the finish times go there instead of into the book."""
    end_s = _time(replicas, planned.runs, timed=timed)
    if finish_s is not None:
        finish_s[planned.finished] = end_s[planned.finished_run]
        return
    book_finish_s = replicas[0].book.finish_s
    for i, v in zip(planned.finished.tolist(), end_s[planned.finished_run].tolist()):
        book_finish_s[i] = v


@dataclass(frozen=True)
class _Timed:
    """The runs' closed forms and their times (one entry per run)."""

    plan: Runs
    dt: np.ndarray

    @staticmethod
    def of(step: StepModel, runs: RunArrays) -> _Timed:
        plan = step.runs(runs.num_decode, runs.context, runs.chunk / runs.num_steps, runs.wave_s_per_token,
                         runs.num_wave)
        return _Timed(plan, plan.time_s(runs.num_steps))

    def take(self, keep: np.ndarray) -> _Timed:
        p = self.plan
        return _Timed(Runs(p.c0[keep], p.c1[keep], p.m0[keep], p.m1[keep], p.floor[keep], p.fixed[keep]), self.dt[keep])


def _time(replicas: list[Replica], runs: RunArrays, apply: bool = True, timed: _Timed | None = None) -> np.ndarray:
    """Time ``runs`` (sorted by replica, each replica's in run order; the replicas all share
    one step model) and return each run's end time; ``apply``: give each replica with runs
    the figures :meth:`Replica.commit` would have added up run after run. ``timed``: the
    runs' step costs (:meth:`_Timed.of`), when known."""
    step = replicas[0].step
    assert all(r.step is step for r in replicas)
    rep, b, ctx, n, chunk, n_wave, wave_flops = (
        runs.replica, runs.num_decode, runs.context, runs.num_steps, runs.chunk, runs.num_wave, runs.wave_flops_per_token)
    if timed is None:
        timed = _Timed.of(step, runs)
    plan, dt = timed.plan, timed.dt
    bounds = np.searchsorted(rep, np.arange(len(replicas) + 1))
    counts = np.diff(bounds)

    def running(starts: list[list[float]], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """For each quantity q and replica, ``starts[q]`` then the running sums of its runs'
        ``values[q]`` left to right (in order, as the event-by-event path adds them): the sum
        after each run, and each replica's total (its start where it has no run). Compiled
        (:func:`rlperf.stages.rollout_loop.running_sums`) where the run-out is (:func:`compiled`), else
        one cumulative sum of every quantity at once (the zeros after a replica's last run
        leave its total as it is): the same additions in the same order."""
        if compiled():
            from rlperf.stages.rollout_loop import running_sums

            return running_sums(np.array(starts, np.float64), np.stack(values).astype(np.float64, copy=False), bounds)
        row, col = rep, np.arange(len(n)) - np.repeat(bounds[:-1], counts) + 1  # run k of its replica: column k + 1
        m = np.zeros((len(values), len(replicas), int(counts.max(initial=0)) + 1))
        m[:, :, 0] = starts
        m[:, row, col] = values
        sums = np.cumsum(m, axis=2)
        return sums[:, row, col], sums[:, np.arange(len(replicas)), counts]

    if not apply:
        end_only: np.ndarray = running([[r.t for r in replicas]], [dt])[0][0]
        return end_only
    flops, num_bytes = run_totals(step, b, ctx, n, chunk, b + -(-chunk // n), b + n_wave, wave_flops)
    roofline = dt - n * plan.fixed
    occupied, prefill = b + n_wave, n_wave > 0
    sts = [r.stats for r in replicas]
    names = ("flops", "bytes_per_gpu", "roofline_s", "busy_s")
    clock = [r.t for r in replicas]
    after, total = running([clock, *([getattr(st, k) for st in sts] for k in names)],
                           [dt, np.asarray(flops), np.asarray(num_bytes), np.asarray(roofline), dt])
    end_s: np.ndarray = after[0]
    totals = dict(zip(names, total[1:].tolist()))
    ends_at = total[0].tolist()
    starts = np.empty(len(end_s))  # each run's start: the replica's clock, then the run before's end
    starts[1:] = end_s[:-1]
    starts[bounds[:-1][counts > 0]] = np.asarray(clock)[counts > 0]
    for k, (r, lo, hi) in enumerate(zip(replicas, bounds[:-1].tolist(), bounds[1:].tolist())):
        if lo == hi:  # no run: nothing committed
            continue
        st = sts[k]
        st.flops, st.bytes_per_gpu = totals["flops"][k], totals["bytes_per_gpu"][k]
        st.roofline_s, st.busy_s = totals["roofline_s"][k], totals["busy_s"][k]
        st.segments.extend_arrays(starts[lo:hi], end_s[lo:hi], occupied[lo:hi], prefill[lo:hi])
        r.t = st.last_end_s = ends_at[k]
    return end_s


def _check_same_runs(a: RunArrays, b: RunArrays) -> None:
    assert all(np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(RunArrays))


def _run_out_until_compiled(replicas: list[Replica], t_stop: float, want: int | None, fresh: frozenset[int],
                            cached: np.ndarray | None = None, initial: BookArrays | None = None,
                            queues: Queues | None = None) -> float:
    """:func:`run_out_until` with the compiled loop: every replica planned on copies (a dry
    run of up to :data:`DRY_RUNS` runs each, or about as many as a stop after finished
    requests needs (:data:`RUNS_PER_FINISH`), four times more until every event up to the stop
    is planned) and timed, which gives the stop; then each planned again from its state up to
    the runs that end by the stop (the same runs: the loop is deterministic), timed, and its
    run in progress planned. When the dry run holds every replica's run in progress, the call
    is also committed to the stop and settled here, on the planner's arrays
    (:func:`_stop_and_settle`), instead of in the book's lists and the replicas' containers."""
    from rlperf.stages.rollout_kernel import CallPlanner

    book = replicas[0].book
    need = None if want is None or book.num_finished >= want else want - book.num_finished
    active = [r for r in replicas if r.busy or r.index in fresh]
    if not active:
        return t_stop
    planner = CallPlanner(active, fresh, cached, initial, queues)
    response = planner.cols[1]
    limit = DRY_RUNS if need is None else min(DRY_RUNS, math.ceil(RUNS_PER_FINISH * need / len(active)) + 32)
    while True:  # dry runs of up to ``limit`` runs per replica until the stop is known
        dry = planner.run(np.full(len(active), limit, np.int64), apply=False)
        timed = _Timed.of(active[0].step, dry.runs)
        end_s = _time(active, dry.runs, apply=False, timed=timed)
        rep = dry.runs.replica
        counts = np.bincount(rep, minlength=len(active))
        last = np.cumsum(counts) - 1
        cut = counts >= limit  # replicas that may have runs left
        known = float(end_s[last[cut]].min()) if cut.any() else math.inf  # every event up to here is planned
        stop = t_stop
        if need is not None:
            whole = dry.generated[dry.finished] == response[dry.finished]
            full_s = end_s[dry.finished_run[whole]]
            if full_s.size >= need:
                stop = min(stop, float(np.partition(full_s, need - 1)[need - 1]))
        if stop <= known:
            break
        limit *= 4
    # The real run plans the dry run's runs again (the loop is deterministic), each replica's
    # first ``done[k]``, so their step costs are the dry run's.
    if stop == math.inf:  # every replica goes idle first: the dry run planned every run
        _settle_idle(active, planner, dry.runs, timed)
        return t_stop
    done = np.bincount(rep[end_s <= stop], minlength=len(active))
    first = np.cumsum(counts) - counts
    keep = np.arange(len(rep)) - first[rep] < done[rep]
    kept_runs = RunArrays(*(getattr(dry.runs, f.name)[keep] for f in dataclasses.fields(RunArrays)))
    if len(replicas) == len(active) and not (cut & (done >= counts)).any():
        # Every replica's run in progress at the stop is the dry run's next one: the call is
        # committed to the stop and settled here, on the planner's arrays.
        _stop_and_settle(active, planner, dry.runs, first + done, done < counts, kept_runs, timed.take(keep), stop)
        return stop
    planned = planner.run(done, apply=True)
    _check_same_runs(planned.runs, kept_runs)
    time_planned(active, planned, timed.take(keep))
    for r in replicas:
        if r.busy:
            r.plan_next()
    return stop


def _settle_idle(active: list[Replica], planner: CallPlanner, dry: RunArrays | None = None,
                 timed: _Timed | None = None) -> None:
    """Every busy replica planned until idle by the compiled loop and timed, the call's outcome
    left as arrays in ``book.settled`` (nothing runs after: the book's lists are not brought up
    to date). ``dry``: the same runs from a dry run, with their step costs ``timed``."""
    book = active[0].book
    planned = planner.run(None, apply=True, lists=False)
    if dry is not None:
        _check_same_runs(planned.runs, dry)
    finish_s = book.finish_array()
    time_planned(active, planned, timed, finish_s)
    book.settled = Settled(finish_s, planned.generated, False)


def _stop_and_settle(active: list[Replica], planner: CallPlanner, dry: RunArrays, next_run: np.ndarray,
                     busy: np.ndarray, kept_runs: RunArrays, timed: _Timed, stop: float) -> None:
    """The end of :func:`_run_out_until_compiled` and of the event loop at a stop, on arrays:
    the runs that end by the stop applied and timed, each busy replica's run in progress
    planned (:meth:`Replica.plan_next`: the dry run's next run) and committed up to the stop
    (:meth:`Replica.run_until`), then every replica settled (:meth:`CallPlanner.settle`); the
    outcome goes to ``book.settled``."""
    book = active[0].book
    planned = planner.run_to_stop(np.bincount(kept_runs.replica, minlength=len(active)))
    _check_same_runs(planned.runs, kept_runs)
    finish_s = book.finish_array()
    time_planned(active, planned, timed, finish_s)
    cut = False
    for k, r in enumerate(active):
        if not r.busy:
            continue
        cut = True
        j = int(next_run[k])
        assert busy[k] and dry.num_decode[j] == r.b and dry.num_wave[j] == len(r.wave)
        n, chunk = int(dry.num_steps[j]), int(dry.chunk[j])
        assert dry.context[j] == r.ctx_fixed + r.b * r.S
        r.plan_n, r.plan_chunk = n, chunk
        r.plan = r.step.run(r.b, r.ctx_fixed + r.b * r.S, chunk / n, r.wave_s_per_token, len(r.wave))
        r.plan_s = r.plan.time_s(n)
        r.run_until(stop, round_up=False)
    planner.settle(finish_s)
    book.settled = Settled(finish_s, planner.cols[3].copy(), cut)

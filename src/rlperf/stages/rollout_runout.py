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
"""

from __future__ import annotations

from itertools import accumulate, chain

import numpy as np

from rlperf.stages.rollout_engine import DECODING, DONE, Replica, RunLog, run_totals
from rlperf.stages.rollout_result import SegmentKind


def run_out(replicas: list[Replica], debug: bool = False) -> None:
    """Run every replica with a planned run until idle (``debug``: check the invariants at
    every event)."""
    active = [r for r in replicas if r.plan is not None]
    for r in active:
        r.log = RunLog()
    todo, may_drain = active, True
    while todo:
        todo = drain([r for r in todo if r.plan_out(may_drain, debug)], debug)
        may_drain = False  # a replica the drain sent back must admit again before retrying
    time_runs(active)
    for r in active:
        r.log = None


def drain(replicas: list[Replica], debug: bool = False) -> list[Replica]:
    """Run out ``replicas``, each holding only decoding sequences (nothing waiting, no wave),
    into their logs; return those that would overflow their KV cache (left unchanged)."""
    if not replicas:
        return []
    bk = replicas[0].book
    # Every live decoding request, ordered by (replica, finish step, join order): the order
    # in which events() would let them leave.
    live = [
        (k, s, o, i)
        for k, r in enumerate(replicas)
        for s, o, i in r.heap
        if bk.status[i] == DECODING and bk.order[i] == o
    ]
    rep, stop, order, ids = (np.array(c, np.int64) for c in zip(*live))
    by = np.lexsort((order, stop, rep))
    rep, stop, ids = rep[by], stop[by], ids[by]
    prompt, generated = np.array(bk.prompt)[ids], np.array(bk.generated)[ids]
    join, private = np.array(bk.join_step)[ids], np.array(bk.private_kv)[ids]
    # What each request takes off ctx_fixed and kv_fixed when it leaves (Replica._leave); the
    # last member of a group also frees the group's shared prompt.
    ctx = prompt + generated - join
    kv = private - join
    sharing = np.array([r.sharing for r in replicas])
    group = np.array(bk.group)[ids]
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

    leaving = np.diff(np.append(first, len(ids)))
    scalars = {k: np.array([getattr(r, k) for r in replicas], np.int64) for k in ("S", "b", "ctx_fixed", "kv_fixed", "cap")}
    b = scalars["b"][run_rep] - before(leaving)
    ctx_fixed = scalars["ctx_fixed"][run_rep] - before(np.add.reduceat(ctx, first))
    kv_fixed = scalars["kv_fixed"][run_rep] - before(np.add.reduceat(kv, first))
    start = np.where(opening, scalars["S"][run_rep], np.r_[0, end[:-1]])
    # A run reaches its finish step with no KV stop iff kv_fixed + b * end <= cap, i.e.
    # (cap - kv_used) // b >= end - start in Replica._plan_steps.
    overflow = kv_fixed + b * end > scalars["cap"][run_rep]
    bad = set(np.unique(run_rep[overflow]).tolist())

    context, steps = (ctx_fixed + b * start).tolist(), (end - start).tolist()
    b_list, left, ids_list = b.tolist(), leaving.tolist(), ids.tolist()
    zeros = [0] * len(b_list)
    gen_list = (generated + stop - join).tolist()  # what _leave counts: target reached
    bounds = np.append(rep_first, len(first)).tolist()
    for k, r in enumerate(replicas):
        if k in bad:
            continue
        log = r.log
        assert log is not None
        lo, hi = bounds[k], bounds[k + 1]
        i0, i1 = int(first[lo]), int(first[hi]) if hi < len(first) else len(ids_list)
        assert i1 - i0 == r.b and int(ctx[i0:i1].sum()) == r.ctx_fixed and int(kv[i0:i1].sum()) == r.kv_fixed
        for j in range(i0, i1):
            i = ids_list[j]
            bk.generated[i] = gen_list[j]
            bk.status[i] = DONE
            bk.num_finished += gen_list[j] == bk.response[i]
        # Nothing is prefilled; the replica's last per-token figures ride along (times zero),
        # as plan_next passes them.
        wave_s, wave_flops = [r.wave_s_per_token] * (hi - lo), [r.wave_flops_per_token] * (hi - lo)
        log.runs.extend(zip(b_list[lo:hi], context[lo:hi], steps[lo:hi], zeros[lo:hi], zeros[lo:hi], wave_s, wave_flops))
        log.ends.extend(list(accumulate(left[lo:hi], initial=len(log.finished)))[1:])
        log.finished.extend(ids_list[i0:i1])
        r.stats.decode_tokens += sum(x * y for x, y in zip(b_list[lo:hi], steps[lo:hi]))
        r.stats.num_steps += int(end[hi - 1]) - r.S
        r.S = int(end[hi - 1])
        r.b = r.ctx_fixed = r.kv_fixed = 0
        r.heap.clear()
        r.stack.clear()
        r.group_resident.clear()
        r.blocked = False
        if debug:
            r.check()
    return [r for k, r in enumerate(replicas) if k in bad]


def time_runs(replicas: list[Replica]) -> None:
    """Time the logged runs of ``replicas`` (all sharing one step model), then give each
    replica the figures :meth:`Replica.commit` would have added up, run after run, and each
    finished request its time."""
    logs = [r.log for r in replicas if r.log is not None]
    assert len(logs) == len(replicas)
    step = replicas[0].step
    assert all(r.step is step for r in replicas)

    cols = list(zip(*chain.from_iterable(log.runs for log in logs)))
    b, ctx, n, chunk, n_wave = (np.array(c, np.int64) for c in cols[:5])
    wave_s, wave_flops = np.array(cols[5], np.float64), np.array(cols[6], np.float64)
    plan = step.runs(b, ctx, chunk / n, wave_s, n_wave)
    dt = plan.time_s(n)
    flops, num_bytes = run_totals(step, b, ctx, n, chunk, b + -(-chunk // n), b + n_wave, wave_flops)
    roofline = dt - n * plan.fixed
    occupied, prefill = (b + n_wave).tolist(), (n_wave > 0).tolist()
    bounds = list(accumulate((len(log.runs) for log in logs), initial=0))
    for r, log, lo, hi in zip(replicas, logs, bounds[:-1], bounds[1:]):
        st = r.stats
        st.flops = _in_order(st.flops, np.asarray(flops)[lo:hi])
        st.bytes_per_gpu = _in_order(st.bytes_per_gpu, np.asarray(num_bytes)[lo:hi])
        st.roofline_s = _in_order(st.roofline_s, roofline[lo:hi])
        st.busy_s = _in_order(st.busy_s, dt[lo:hi])
        t = list(accumulate(dt[lo:hi].tolist(), initial=r.t))
        kinds: list[SegmentKind] = ["prefill" if w else "decode" for w in prefill[lo:hi]]
        st.segments.extend(zip(t[:-1], t[1:], occupied[lo:hi], kinds))
        r.t = st.last_end_s = t[-1]
        done, finish_s = 0, r.book.finish_s
        for k, upto in enumerate(log.ends):
            for i in log.finished[done:upto]:
                finish_s[i] = t[k + 1]
            done = upto


def _in_order(start: float, values: np.ndarray) -> float:
    """``start + values[0] + values[1] + ...`` left to right, as the event-by-event path adds
    them (``sum`` may compensate: it does for floats from Python 3.12)."""
    for v in values.tolist():
        start += v
    return start

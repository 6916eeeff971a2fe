"""The run-out's event loop compiled: every replica of a call planned to idle on integer arrays.

:meth:`rlperf.stages.rollout_engine.Replica.plan_out` plans a replica's remaining runs on
integers, event by event (completions, the wave joining, preemptions, FCFS admission), at
about 5 µs of Python per event. :func:`plan_to_idle` runs that loop as machine code
(:func:`rlperf.stages.rollout_loop.plan_to_idle_loop`, compiled at install or by numba:
:mod:`rlperf.stages.jit`): :class:`CallPlanner` packs the replicas and the book into its arrays
and unpacks what it returns into the replicas, the book and :class:`Planned` runs. Nothing
about a run's time is decided here: the runs are logged as :class:`RunLog` entries are and
:func:`rlperf.stages.rollout_runout.time_runs` times them, so the result is the same to the
last bit (tests/test_rollout_kernel.py compares every field).

Where the loops run as plain Python (numba missing: it is a pinned dependency, but the core
must import without compiled extras), :func:`rlperf.stages.rollout_runout.compiled` is False
and the run-out keeps its Python loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from rlperf.stages.request_status import DECODING, DONE, WAITING
from rlperf.stages.rollout_engine import Book, BookArrays, Queues, Replica, RunArrays
from rlperf.stages.rollout_loop import plan_to_idle_loop

if TYPE_CHECKING:
    from rlperf.stages.rollout_step import StepModel

@dataclass(frozen=True)
class Planned:
    """Runs planned to idle, every replica's in run order, and the requests that finished:
    ``finished[k]`` ended with run ``finished_run[k]``."""

    runs: RunArrays
    finished: np.ndarray
    finished_run: np.ndarray
    generated: np.ndarray  # every request's generated tokens after the runs


def plan_to_idle(replicas: list[Replica], fresh: frozenset[int] = frozenset(),
                 cached: np.ndarray | Sequence[bool] | None = None, initial: BookArrays | None = None) -> Planned:
    """Plan every replica (all of one call, every request arrived, no stop) until idle, as
    :meth:`Replica.plan_out` would without draining; update the book and the replicas' step
    counts and counters (times are left to :func:`time_runs`). The replicas whose index is in
    ``fresh`` first apply the events of their current step (:meth:`Replica.events`: requests
    were just queued on them), after resuming the requests at the head of their queues whose
    KV is ``cached`` (one flag per request; :meth:`Replica.resume`, as
    ``rlperf.stages.rollout._resume_cached`` does). ``initial``: the book's arrays when nothing
    has run yet."""
    return CallPlanner(replicas, fresh, cached, initial).run(None, apply=True)


class CallPlanner:
    """One call's replicas and book as the compiled loop's arrays, planned by :meth:`run`."""

    def __init__(self, replicas: list[Replica], fresh: frozenset[int], cached: np.ndarray | Sequence[bool] | None = None,
                 initial: BookArrays | None = None, queues: Queues | None = None) -> None:
        self.replicas = replicas
        bk: Book = replicas[0].book
        step: StepModel = replicas[0].step
        self.book = bk
        n_req = bk.num_requests
        # A writable copy: numba compiles (and loads from its cache) one machine code per
        # argument type, and a read-only array is another type (a second 0.5 MB load).
        self.cached = np.zeros(n_req, np.bool_) if cached is None else np.array(cached, np.bool_)
        # Prompt, response and target never change in a call: from the arrays it was built
        # with; the others from the book's lists where made, else as built (every request
        # waiting, nothing joined: status, join step, KV and order 0).
        assert WAITING == 0
        arrays = bk.arrays
        self.cols = np.zeros((8, n_req), np.int64)
        self.cols[0], self.cols[1], self.cols[2] = arrays.prompt, arrays.response, arrays.target
        if initial is not None or not bk.made("generated"):
            self.cols[3] = arrays.generated
        if initial is None:
            for row, name in enumerate(("generated", "status", "join_step", "private_kv", "order"), 3):
                if bk.made(name):
                    self.cols[row] = getattr(bk, name)
        self.group_ids = bk.groups.ids
        self.group = np.ascontiguousarray(bk.groups.inverse, np.int64)
        self.state = np.array([[r.S, r.b, r.ctx_fixed, r.kv_fixed, r.wave_left, int(r.blocked), r.next_order, r.cap,
                                r.max_seqs, r.budget, int(r.sharing), int(r.index in fresh)] for r in replicas],
                              np.int64).reshape(len(replicas), 12)
        self.wave_f = np.array([[r.wave_s_per_token, r.wave_flops_per_token] for r in replicas],
                               np.float64).reshape(-1, 2)

        def flat(parts: Sequence[Iterable[int]], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
            values = np.fromiter(chain.from_iterable(parts), np.int64, sum(sizes))
            return values, np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))

        gmap = dict(zip(bk.group, self.group.tolist())) if any(r.group_resident for r in replicas) else {}
        if queues is None:
            waiting = flat([r.waiting for r in replicas], [len(r.waiting) for r in replicas])
        else:  # the replicas' own queues are empty
            assert not any(r.waiting for r in replicas)
            held = queues.counts[[r.index for r in replicas]]
            assert held.sum() == len(queues.requests)
            waiting = np.ascontiguousarray(queues.requests, np.int64), np.concatenate(([0], np.cumsum(held)))
        self.containers = (
            *waiting,
            *flat([r.wave for r in replicas], [len(r.wave) for r in replicas]),
            *flat([r.stack for r in replicas], [len(r.stack) for r in replicas]),
            *flat([chain.from_iterable(r.heap) for r in replicas], [3 * len(r.heap) for r in replicas]),
            *flat([[x for g, c in r.group_resident.items() for x in (gmap[g], c)] for r in replicas],
                  [2 * len(r.group_resident) for r in replicas]),
        )
        self.consts = np.array([step.prefill_linear_flops_per_token, step.lm_head_flops, step.attention_flops_per_pair,
                                step.matmul_flops_per_s, step.attention_flops_per_s], np.float64)

    def run(self, max_runs: np.ndarray | None, apply: bool, lists: bool = True) -> Planned:
        """Plan every replica until idle, replica ``k`` stopping after ``max_runs[k]`` runs
        (None: none stops early), its state left as :meth:`Replica.plan_out` leaves it.
        ``apply`` False: the book and the replicas are left untouched (a dry run: only the
        runs and the finishes, with ``Planned.generated``), and the planner can run again.
        ``lists`` False: the replicas are updated but not the book's lists (the caller keeps
        the outcome as arrays)."""
        n_rep = len(self.replicas)
        limit = np.full(n_rep, 1 << 62, np.int64) if max_runs is None else np.ascontiguousarray(max_runs, np.int64)
        early = max_runs is not None
        cols, state, wave_f = (self.cols, self.state, self.wave_f) if apply else (
            self.cols.copy(), self.state.copy(), self.wave_f.copy())
        ints, floats, fin, fin_run, counters, kept, kept_at = plan_to_idle_loop(
            cols, self.group, state, wave_f, *self.containers, self.consts, int(self.group.max(initial=0)) + 1,
            limit, early and apply, np.zeros(16, np.int64), np.zeros(n_rep, np.int64), self.cached)
        runs = RunArrays(ints[:, 0], ints[:, 1], ints[:, 2], ints[:, 3], ints[:, 4], ints[:, 5], floats[:, 0],
                         floats[:, 1])
        planned = Planned(runs, fin, fin_run, cols[3])
        if apply:
            self._apply(planned, counters, kept if early else None, kept_at, lists)
        return planned

    def run_to_stop(self, done: np.ndarray) -> Planned:
        """:meth:`run` applied, replica ``k`` stopping after ``done[k]`` runs, for a call that
        ends at the stop: each replica's scalars, wave and counters are set (what committing
        its run in progress reads, :meth:`Replica.commit`), the rest of its state is kept as
        arrays for :meth:`settle`, and the book's lists are not brought up to date."""
        n_rep = len(self.replicas)
        ints, floats, fin, fin_run, counters, kept, kept_at = plan_to_idle_loop(
            self.cols, self.group, self.state, self.wave_f, *self.containers, self.consts,
            int(self.group.max(initial=0)) + 1, np.ascontiguousarray(done, np.int64), True, np.zeros(16, np.int64),
            np.zeros(n_rep, np.int64), self.cached)
        runs = RunArrays(ints[:, 0], ints[:, 1], ints[:, 2], ints[:, 3], ints[:, 4], ints[:, 5], floats[:, 0],
                         floats[:, 1])
        self.kept, self.kept_at = kept, kept_at
        for k, r in enumerate(self.replicas):
            self._set_replica(k, counters)
            r.wave = self._section(k, 1).tolist()
        return Planned(runs, fin, fin_run, self.cols[3])

    def _set_replica(self, k: int, counters: np.ndarray) -> None:
        """Replica ``k``'s scalars and counters as the kernel left them; its containers emptied
        (the caller fills what it needs)."""
        r = self.replicas[k]
        _, decoded, prefilled, steps, preempted = counters[k].tolist()
        r.S, r.b, r.ctx_fixed, r.kv_fixed, r.wave_left, blocked, r.next_order = self.state[k, :7].tolist()
        r.blocked = blocked != 0
        r.wave_s_per_token, r.wave_flops_per_token = self.wave_f[k].tolist()
        r.waiting.clear()
        r.heap.clear()
        r.stack.clear()
        r.wave = []
        r.group_resident.clear()
        r.plan = None
        st = r.stats
        st.decode_tokens += decoded
        st.prefill_tokens += prefilled
        st.num_steps += steps
        st.preemptions += preempted

    def _section(self, k: int, which: int) -> np.ndarray:
        """Section ``which`` of replica ``k``'s kept state (0 queue, 1 wave, 2 stack, 3 heap as
        (finish step, join order, request) rows, 4 resident groups)."""
        kept, at = self.kept, int(self.kept_at[k])
        width = (1, 1, 1, 3, 2)
        for w in width[:which]:
            at += 1 + w * int(kept[at])
        n = int(kept[at])
        return kept[at + 1: at + 1 + width[which] * n]

    def settle(self, finish_s: np.ndarray) -> None:
        """:meth:`Replica.settle_stopped` of every replica on the arrays, each replica's run in
        progress committed up to the stop (:meth:`Replica.run_until`): its wave joins if
        prefilled, and every decoding request leaves, those due by the replica's step done (at
        the replica's time, into ``finish_s``), the others waiting. The same updates in one
        pass per replica (each live heap entry once: a stale entry's request is no longer
        decoding under that join order)."""
        target, generated, status, join_step, order = self.cols[2], self.cols[3], self.cols[4], self.cols[5], self.cols[7]
        for k, r in enumerate(self.replicas):
            heap = self._section(k, 3).reshape(-1, 3)
            s, o, i = heap[:, 0], heap[:, 1], heap[:, 2]
            S = r.S
            if r.wave and r.wave_left == 0:  # Replica._join_wave
                wave = np.asarray(r.wave, np.int64)
                gen = generated[wave] + 1
                generated[wave] = gen
                status[wave] = DECODING
                join_step[wave] = S
                joined = r.next_order + np.arange(len(wave), dtype=np.int64)
                order[wave] = joined
                s, o, i = np.concatenate((s, S + target[wave] - gen)), np.concatenate((o, joined)), np.concatenate((i, wave))
                r.stats.decode_tokens += len(wave)
            live = (status[i] == DECODING) & (order[i] == o)
            s, i = s[live], i[live]
            generated[i] += S - join_step[i]
            due = s <= S
            status[i] = np.where(due, DONE, WAITING)
            finish_s[i[due]] = r.t

    def _apply(self, planned: Planned, counters: np.ndarray, kept: np.ndarray | None, kept_at: np.ndarray,
               lists: bool) -> None:
        bk, cols, fin = self.book, self.cols, planned.finished
        if lists:
            bk.generated = cols[3].tolist()
            bk.status = cols[4].tolist()
            bk.join_step = cols[5].tolist()
            bk.private_kv = cols[6].tolist()
            bk.order = cols[7].tolist()
        bk.num_finished += int(np.sum(cols[3][fin] == cols[1][fin]))
        values = kept.tolist() if kept is not None else []
        for k, r in enumerate(self.replicas):
            self._set_replica(k, counters)
            if kept is not None:  # the replica's queue, wave, stack, heap and resident groups, as the kernel left them
                at = int(kept_at[k])
                n = values[at]
                r.waiting.extend(values[at + 1 : at + 1 + n])
                at += 1 + n
                n = values[at]
                r.wave = values[at + 1 : at + 1 + n]
                at += 1 + n
                n = values[at]
                r.stack.extend(values[at + 1 : at + 1 + n])
                at += 1 + n
                n = values[at]
                flat_heap = values[at + 1 : at + 1 + 3 * n]
                r.heap.extend(zip(flat_heap[0::3], flat_heap[1::3], flat_heap[2::3]))
                at += 1 + 3 * n
                n = values[at]
                pairs = values[at + 1 : at + 1 + 2 * n]
                ids = self.group_ids[pairs[0::2]].tolist() if n else []
                r.group_resident.update(zip(ids, pairs[1::2]))
            else:
                r.S, r.b, r.ctx_fixed, r.kv_fixed, r.wave_left, r.blocked = int(counters[k, 0]), 0, 0, 0, 0, False

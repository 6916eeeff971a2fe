"""The run-out's event loop compiled: every replica planned to idle on integer arrays.

:meth:`rlperf.stages.rollout_engine.Replica.plan_out` plans a replica's remaining runs on
integers, event by event (completions, the wave joining, preemptions, FCFS admission), at
about 5 µs of Python per event. :func:`plan_to_idle` is that loop, the same statements in the
same order, on int64 arrays in one function that numba compiles to machine code (cached on
disk after the first run): the book's columns, each replica's waiting queue (a ring buffer),
its decoding heap ``(finish step, join order, request)`` (a binary heap: its keys are
distinct, so it pops in the same order as :mod:`heapq`), its stack of joined requests and its
groups' resident counts. Nothing about a run's time is decided here: the runs are logged as
:class:`RunLog` entries are (decoding sequences, their context at the first step, steps, wave
tokens, wave size, the wave's prefill time and FLOPs per token, the latter two with the float
operations of :meth:`rlperf.stages.rollout_step.StepModel.prefill_s_per_token` /
``prefill_flops`` in the same order) and :func:`rlperf.stages.rollout_runout.time_runs` times
them, so the result is the same to the last bit (tests/test_rollout_kernel.py compares every
field).

Without numba (it is a pinned dependency, but the core must import without compiled extras)
:func:`available` is False and the run-out keeps the Python loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from rlperf.stages.jit import COMPILED, jit
from rlperf.stages.rollout_engine import DECODING, DONE, PREFILL, WAITING, Book, BookArrays, Queues, Replica, RunArrays

if TYPE_CHECKING:
    from rlperf.stages.rollout_step import StepModel

def available() -> bool:
    """True when the compiled loop can be used (numba imports)."""
    return COMPILED


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
        ints, floats, fin, fin_run, counters, kept, kept_at = _plan_to_idle(
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
        ints, floats, fin, fin_run, counters, kept, kept_at = _plan_to_idle(
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


@jit
def _grow(a: np.ndarray) -> np.ndarray:
    out = np.empty(2 * a.shape[0], a.dtype)
    out[: a.shape[0]] = a
    return out


@jit
def _grow2(a: np.ndarray) -> np.ndarray:
    out = np.empty((2 * a.shape[0], a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


@jit
def _plan_to_idle(
    cols: np.ndarray, group: np.ndarray, state: np.ndarray, wave_f: np.ndarray, waiting0: np.ndarray,
    waiting_at: np.ndarray, wave0: np.ndarray, wave_at: np.ndarray, stack0: np.ndarray, stack_at: np.ndarray,
    heap0: np.ndarray, heap_at: np.ndarray, res0: np.ndarray, res_at: np.ndarray, consts: np.ndarray, n_groups: int,
    max_runs: np.ndarray, keep: bool, kept: np.ndarray, kept_at: np.ndarray, kv_cached: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The loop of :meth:`Replica.plan_out` (``may_drain`` False, no stop) for every replica,
    one after another, with :meth:`Replica.events`, ``_join_wave``, ``_leave``, ``_finish``,
    ``_preempt``, ``_release_group``, ``_admit`` and ``_plan_steps`` written inline on arrays.
    Replica ``k`` stops after ``max_runs[k]`` runs (their events applied). With ``keep``, each
    replica's state is left in ``state`` / ``wave_f`` and its queue, wave, stack, heap and
    resident groups appended to ``kept`` (five sections per replica, each a length then its
    entries; ``kept_at[k]``: where replica ``k``'s start). A replica that applies its events
    first (``state[k, 11]``) resumes before them the requests at the head of its queue whose KV
    is still cached (``kv_cached``, :meth:`Replica.resume`). Compiled by numba; plain Python
    (slow) without it."""
    prompt, target, generated, status, join_step, private_kv, order_of = (
        cols[0], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7])
    lin_per_token, lm_head, attn_per_pair, matmul_rate, attn_rate = consts[0], consts[1], consts[2], consts[3], consts[4]
    n_req = prompt.shape[0]
    n_rep = state.shape[0]
    ring = np.empty(n_req + 1, np.int64)  # the waiting queue, a ring buffer (a request is queued once at most)
    wave = np.empty(n_req + 1, np.int64)
    stack = np.empty(max(16, n_req), np.int64)
    hs = np.empty(max(16, n_req), np.int64)  # heap keys: finish step, join order; and the request
    ho = np.empty(max(16, n_req), np.int64)
    hr = np.empty(max(16, n_req), np.int64)
    resident = np.zeros(n_groups, np.int64)
    ints = np.empty((1024, 6), np.int64)
    floats = np.empty((1024, 2), np.float64)
    fin = np.empty(n_req, np.int64)
    fin_run = np.empty(n_req, np.int64)
    counters = np.zeros((n_rep, 5), np.int64)
    n_runs = 0
    n_fin = 0
    n_kept = 0
    for k in range(n_rep):
        S, b, ctx_fixed, kv_fixed, wave_left = state[k, 0], state[k, 1], state[k, 2], state[k, 3], state[k, 4]
        blocked, next_order, cap, max_seqs, budget = state[k, 5] != 0, state[k, 6], state[k, 7], state[k, 8], state[k, 9]
        sharing = state[k, 10] != 0
        wave_s, wave_flops = wave_f[k, 0], wave_f[k, 1]
        size_ring = n_req + 1
        head = 0
        tail = 0
        for x in range(waiting_at[k], waiting_at[k + 1]):
            ring[tail] = waiting0[x]
            tail += 1
        n_wait = tail
        n_wave = 0
        for x in range(wave_at[k], wave_at[k + 1]):
            wave[n_wave] = wave0[x]
            n_wave += 1
        n_stack = 0
        for x in range(stack_at[k], stack_at[k + 1]):
            if n_stack == stack.shape[0]:
                stack = _grow(stack)
            stack[n_stack] = stack0[x]
            n_stack += 1
        # The heap arrives as Python's heapq list: already a valid binary heap in this layout.
        n_heap = 0
        for x in range(heap_at[k], heap_at[k + 1], 3):
            if n_heap == hs.shape[0]:
                hs, ho, hr = _grow(hs), _grow(ho), _grow(hr)
            hs[n_heap], ho[n_heap], hr[n_heap] = heap0[x], heap0[x + 1], heap0[x + 2]
            n_heap += 1
        for x in range(res_at[k], res_at[k + 1], 2):
            resident[res0[x]] = res0[x + 1]
        decoded = 0
        prefilled = 0
        steps = 0
        preempted = 0
        planning = state[k, 11] == 0  # 1: apply the events at the current step first
        # ---- resume: the cached requests at the head of a fresh replica's queue join its batch
        while not planning and n_wait > 0 and kv_cached[ring[head]]:
            i = ring[head]
            p, gen, g = prompt[i], generated[i], group[i]
            shared = sharing and resident[g] > 0
            need = (0 if shared else p) + gen
            if n_wave > 0 or b >= max_seqs or need + b + 1 > cap - (kv_fixed + b * S):
                break
            head = (head + 1) % size_ring
            n_wait -= 1
            if sharing:
                resident[g] += 1
            private_kv[i] = gen + (0 if sharing else p)
            status[i] = DECODING
            join_step[i] = S
            order_of[i] = next_order
            if n_heap == hs.shape[0]:
                hs, ho, hr = _grow(hs), _grow(ho), _grow(hr)
            n_heap = _heap_push(hs, ho, hr, n_heap, S + target[i] - gen, next_order, i)
            next_order += 1
            b += 1
            ctx_fixed += p + gen - S
            kv_fixed += need - S
            if n_stack == stack.shape[0]:
                stack = _grow(stack)
            stack[n_stack] = i
            n_stack += 1
        runs_k = 0
        while True:
            if planning:
                # ---- _plan_steps
                if runs_k >= max_runs[k] or not (b > 0 or n_wave > 0):
                    break
                n = 1 << 62
                if b > 0:
                    while status[hr[0]] != DECODING or order_of[hr[0]] != ho[0]:
                        n_heap = _heap_pop(hs, ho, hr, n_heap)
                    n = min(hs[0] - S, (cap - (kv_fixed + b * S)) // b)
                chunk = 0
                if n_wave > 0:
                    per_step = budget - b
                    n = min(n, -(-wave_left // per_step))
                    chunk = min(wave_left, n * per_step)
                # ---- log the run
                if n_runs == ints.shape[0]:
                    ints, floats = _grow2(ints), _grow2(floats)
                ints[n_runs, 0] = k
                ints[n_runs, 1] = b
                ints[n_runs, 2] = ctx_fixed + b * S
                ints[n_runs, 3] = n
                ints[n_runs, 4] = chunk
                ints[n_runs, 5] = n_wave
                floats[n_runs, 0] = wave_s
                floats[n_runs, 1] = wave_flops
                # ---- _advance
                wave_left -= chunk
                prefilled += chunk
                decoded += b * n
                steps += n
                S += n
            # ---- events: the wave joins
            if n_wave > 0 and wave_left == 0:
                ctx = 0
                for w in range(n_wave):
                    i = wave[w]
                    gen = generated[i] + 1
                    generated[i] = gen
                    status[i] = DECODING
                    join_step[i] = S
                    order_of[i] = next_order
                    ctx += prompt[i] + gen - S
                    if n_heap == hs.shape[0]:
                        hs, ho, hr = _grow(hs), _grow(ho), _grow(hr)
                    n_heap = _heap_push(hs, ho, hr, n_heap, S + target[i] - gen, next_order, i)
                    next_order += 1
                    if n_stack == stack.shape[0]:
                        stack = _grow(stack)
                    stack[n_stack] = i
                    n_stack += 1
                decoded += n_wave
                b += n_wave
                ctx_fixed += ctx
                kv_fixed -= n_wave * S
                n_wave = 0
            # ---- completions
            while n_heap > 0 and hs[0] <= S:
                o, i = ho[0], hr[0]
                n_heap = _heap_pop(hs, ho, hr, n_heap)
                if status[i] == DECODING and order_of[i] == o:
                    d_ctx, d_kv = _leave(i, S, prompt, generated, join_step, private_kv, group, resident, sharing)
                    b -= 1
                    ctx_fixed -= d_ctx
                    kv_fixed -= d_kv
                    status[i] = DONE
                    fin[n_fin] = i
                    fin_run[n_fin] = n_runs
                    n_fin += 1
                    blocked = False
            # ---- preemptions
            while b > 0 and kv_fixed + b * (S + 1) > cap:
                n_stack -= 1
                i = stack[n_stack]
                while status[i] != DECODING:
                    n_stack -= 1
                    i = stack[n_stack]
                d_ctx, d_kv = _leave(i, S, prompt, generated, join_step, private_kv, group, resident, sharing)
                b -= 1
                ctx_fixed -= d_ctx
                kv_fixed -= d_kv
                status[i] = WAITING
                head = (head - 1) % size_ring
                ring[head] = i
                n_wait += 1
                blocked = True
                preempted += 1
            if not (b > 0 or n_wave > 0):
                blocked = False
            # ---- admission
            if n_wave == 0 and not blocked and n_wait > 0 and b < max_seqs:
                kv_free = cap - (kv_fixed + b * S) - b
                free_slots = max_seqs - b
                tokens = 0
                kv_added = 0
                pairs = 0.0
                while n_wait > 0 and free_slots > 0:
                    i = ring[head]
                    p, gen, g = prompt[i], generated[i], group[i]
                    shared = sharing and resident[g] > 0
                    need = (0 if shared else p) + gen + 1
                    if need > kv_free:
                        break
                    head = (head + 1) % size_ring
                    n_wait -= 1
                    kv_free -= need
                    kv_added += need
                    free_slots -= 1
                    if sharing:
                        resident[g] += 1
                    private_kv[i] = gen + 1 + (0 if sharing else p)
                    status[i] = PREFILL
                    if shared:
                        new, cached = gen, p
                    else:
                        new, cached = p + gen, 0
                    if new == 0:
                        new, cached = 1, p - 1
                    tokens += new
                    pairs += new * cached + 0.5 * new * (new + 1)
                    wave[n_wave] = i
                    n_wave += 1
                kv_fixed += kv_added
                if n_wave > 0:
                    wave_left = tokens
                    lin = tokens * lin_per_token + n_wave * lm_head
                    attn = pairs * attn_per_pair
                    wave_s = (lin / matmul_rate + attn / attn_rate) / tokens
                    wave_flops = (lin + pairs * attn_per_pair) / tokens
            if planning:
                n_runs += 1
                runs_k += 1
            planning = True
        state[k, 6] = next_order
        if keep:
            state[k, 0], state[k, 1], state[k, 2], state[k, 3], state[k, 4] = S, b, ctx_fixed, kv_fixed, wave_left
            state[k, 5] = 1 if blocked else 0
            wave_f[k, 0], wave_f[k, 1] = wave_s, wave_flops
            need = n_kept + 5 + n_wait + n_wave + n_stack + 3 * n_heap + 2 * n_groups
            while kept.shape[0] < need:
                kept = _grow(kept)
            kept_at[k] = n_kept
            kept[n_kept] = n_wait
            n_kept += 1
            for x in range(n_wait):
                kept[n_kept] = ring[(head + x) % size_ring]
                n_kept += 1
            kept[n_kept] = n_wave
            n_kept += 1
            for x in range(n_wave):
                kept[n_kept] = wave[x]
                n_kept += 1
            kept[n_kept] = n_stack
            n_kept += 1
            for x in range(n_stack):
                kept[n_kept] = stack[x]
                n_kept += 1
            kept[n_kept] = n_heap
            n_kept += 1
            for x in range(n_heap):
                kept[n_kept], kept[n_kept + 1], kept[n_kept + 2] = hs[x], ho[x], hr[x]
                n_kept += 3
            at = n_kept
            kept[n_kept] = 0
            n_kept += 1
            for g in range(n_groups):
                if resident[g] != 0:
                    kept[n_kept], kept[n_kept + 1] = g, resident[g]
                    n_kept += 2
                    kept[at] += 1
                    resident[g] = 0  # the next replica starts from its own groups
        elif b > 0 or n_wave > 0:  # stopped early: the next replica starts from its own groups
            resident[:] = 0
        counters[k, 0] = S
        counters[k, 1] = decoded
        counters[k, 2] = prefilled
        counters[k, 3] = steps
        counters[k, 4] = preempted
    return ints[:n_runs], floats[:n_runs], fin[:n_fin], fin_run[:n_fin], counters, kept[:n_kept], kept_at


@jit
def _leave(i: int, S: int, prompt: np.ndarray, generated: np.ndarray, join_step: np.ndarray, private_kv: np.ndarray,
           group: np.ndarray, resident: np.ndarray, sharing: bool) -> tuple[int, int]:
    """:meth:`Replica._leave` and ``_release_group`` of request ``i`` at step ``S``: fix its
    count; return what the replica's ``ctx_fixed`` and ``kv_fixed`` lose."""
    j = join_step[i]
    generated[i] += S - j
    kv = private_kv[i] - j
    if sharing:
        g = group[i]
        resident[g] -= 1
        if resident[g] == 0:  # the group's last member frees the shared prompt
            kv += prompt[i]
    return prompt[i] + generated[i] - (S - j) - j, kv


@jit
def _heap_push(hs: np.ndarray, ho: np.ndarray, hr: np.ndarray, n: int, s: int, o: int, i: int) -> int:
    """heapq.heappush of (s, o, i) onto the first ``n`` entries (keys (s, o) distinct)."""
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if hs[parent] < s or (hs[parent] == s and ho[parent] < o):
            break
        hs[pos], ho[pos], hr[pos] = hs[parent], ho[parent], hr[parent]
        pos = parent
    hs[pos], ho[pos], hr[pos] = s, o, i
    return n + 1


@jit
def _heap_pop(hs: np.ndarray, ho: np.ndarray, hr: np.ndarray, n: int) -> int:
    """heapq.heappop's removal of the smallest entry; returns the new size."""
    n -= 1
    s, o, i = hs[n], ho[n], hr[n]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and (hs[child + 1] < hs[child] or (hs[child + 1] == hs[child] and ho[child + 1] < ho[child])):
            child += 1
        if hs[child] > s or (hs[child] == s and ho[child] > o):
            break
        hs[pos], ho[pos], hr[pos] = hs[child], ho[child], hr[child]
        pos = child
    if n > 0:
        hs[pos], ho[pos], hr[pos] = s, o, i
    return n


@jit
def running_sums(starts: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each quantity ``q`` and replica ``k`` (whose runs are ``bounds[k]:bounds[k + 1]``, in
    run order): ``starts[q, k]`` plus its runs' ``values[q]`` added one after the other, as
    :func:`numpy.cumsum` adds along a row; returns the sum after each run (shaped as ``values``)
    and after the replica's last (``starts`` where it has none)."""
    ends = np.empty(values.shape, np.float64)
    totals = np.empty(starts.shape, np.float64)
    for q in range(values.shape[0]):
        for k in range(bounds.shape[0] - 1):
            acc = starts[q, k]
            for j in range(bounds[k], bounds[k + 1]):
                acc = acc + values[q, j]
                ends[q, j] = acc
            totals[q, k] = acc
    return ends, totals


@jit
def envelope_sums(c0: np.ndarray, c1: np.ndarray, m0: np.ndarray, m1: np.ndarray, floor: np.ndarray,
                  n: np.ndarray) -> np.ndarray:
    """:func:`rlperf.stages.rollout_step.envelope_sum` of each run's three lines (compute,
    memory, floor) over its ``n[k]`` steps, with the same float operations in the same order
    (the line highest at ``i``, ties to the steeper, then the first; each piece an arithmetic
    series)."""
    out = np.empty(n.shape[0], np.float64)
    a_of = np.empty(3, np.float64)
    s_of = np.empty(3, np.float64)
    for k in range(n.shape[0]):
        a_of[0], a_of[1], a_of[2] = c0[k], m0[k], floor[k]
        s_of[0], s_of[1], s_of[2] = c1[k], m1[k], 0.0
        steps = n[k]
        i = 0
        total = 0.0
        while i < steps:
            best = 0
            for j in range(1, 3):
                v, vb = a_of[j] + s_of[j] * i, a_of[best] + s_of[best] * i
                if v > vb or (v == vb and s_of[j] > s_of[best]):
                    best = j
            a, s = a_of[best], s_of[best]
            nxt = steps
            for j in range(3):
                a2, s2 = a_of[j], s_of[j]
                if s2 > s and a - a2 < (s2 - s) * steps:
                    nxt = min(nxt, max(i + 1, math.floor((a - a2) / (s2 - s)) + 1))
            total += (nxt - i) * a + s * 0.5 * (nxt * (nxt - 1) - i * (i - 1))
            i = nxt
        out[k] = total
    return out

"""The rollout run-out's loops on integer and float arrays, compiled (:mod:`rlperf.stages.jit`).

* :func:`plan_to_idle_loop`: :meth:`rlperf.stages.rollout_engine.Replica.plan_out`'s event loop
  (completions, the wave joining, preemptions, FCFS admission) for every replica of a call, the
  same statements in the same order on int64 arrays: the book's columns, each replica's waiting
  queue (a ring buffer), its decoding heap ``(finish step, join order, request)`` (a binary
  heap: its keys are distinct, so it pops in the same order as :mod:`heapq`), its stack of
  joined requests and its groups' resident counts. Nothing about a run's time is decided here:
  the runs are logged (decoding sequences, their context at the first step, steps, wave tokens,
  wave size, the wave's prefill time and FLOPs per token, the latter two with the float
  operations of :meth:`rlperf.stages.rollout_step.StepModel.prefill_s_per_token` /
  ``prefill_flops`` in the same order) and :func:`rlperf.stages.rollout_runout.time_runs` times
  them. :class:`rlperf.stages.rollout_kernel.CallPlanner` packs a call into these arrays and
  unpacks the result.
* :func:`running_sums`: the run-out's timing sums, run after run, as :func:`numpy.cumsum` adds.
* :func:`envelope_sums`: :func:`rlperf.stages.rollout_step.envelope_sum` of many runs.

This module imports nothing of rlperf but :mod:`rlperf.stages.jit` and
:mod:`rlperf.stages.request_status` (setup.py compiles it in a bare build environment).
tests/test_rollout_kernel.py compares the results with the Python run-out, field by field.
"""

from __future__ import annotations

import math

import numpy as np

from rlperf.stages.jit import helper, loop
from rlperf.stages.request_status import DECODING, DONE, PREFILL, WAITING


@helper
def _grow(a: np.ndarray) -> np.ndarray:
    out = np.empty(2 * a.shape[0], a.dtype)
    out[: a.shape[0]] = a
    return out


@helper
def _grow2(a: np.ndarray) -> np.ndarray:
    out = np.empty((2 * a.shape[0], a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


@loop(
    "Tuple((i8[:, :], f8[:, :], i8[:], i8[:], i8[:, :], i8[:], i8[:]))("
      "i8[:, :], i8[:], i8[:, :], f8[:, :], i8[:], i8[:], i8[:], i8[:], i8[:], i8[:], i8[:], i8[:], i8[:], i8[:], "
      "f8[:], i8, i8[:], b1, i8[:], i8[:], b1[:])"
)
def plan_to_idle_loop(
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


@helper
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


@helper
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


@helper
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


@loop("Tuple((f8[:, :], f8[:, :]))(f8[:, :], f8[:, :], i8[:])")
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


@loop("f8[:](f8[:], f8[:], f8[:], f8[:], f8[:], i8[:])")
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

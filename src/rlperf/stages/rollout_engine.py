"""Continuous batching on one engine replica, simulated at request granularity.

Between two events (a completion, an admission, the end of a prefill wave, a preemption) the
batch is fixed and every decoding sequence grows by one token per step, so the total context is
``C(S) = ctx_fixed + b·S`` and the KV in use is ``kv_fixed + b·S`` at step ``S``: a run of
steps is one closed form (:class:`rlperf.stages.rollout_step.Run`), and the cost of a rollout
grows with the number of requests, not of tokens.

Scheduling policy (documented choices, modelled on vLLM V1):

* **Admission** is FCFS from the waiting queue, at a step boundary when no prefill wave is in
  flight: the head request is admitted while the replica has fewer than ``max_num_seqs``
  occupied slots and the KV cache can hold its current context plus its first new token. The
  queue is not reordered (head-of-line blocking as in vLLM's FCFS policy).
* **Prefill** of the requests admitted together (a *wave*) is chunked: each step carries the
  ``b`` running decodes plus ``max_num_batched_tokens - b`` prompt tokens. Wave members start
  decoding when the whole wave is prefilled; the last prefill step samples their first token.
* **Prefix sharing**: a group's prompt is prefilled once per replica and its KV counted once
  while any member of the group is resident; later members prefill only their own tokens (at
  least one token, the last prompt position, to get logits). Attention still reads the shared
  prompt once per sequence (no cascade attention).
* **Preemption** (vLLM's recompute mode): when the next step would overflow the KV cache, the
  most recently joined decoding sequence is evicted, keeps its generated tokens and goes back
  to the *front* of the waiting queue; its prompt and generated tokens are re-prefilled when it
  is admitted again. After a preemption, admission waits for the next completion on the
  replica. This never deadlocks: without admissions the running set only shrinks while every
  step makes progress, and a single request fits alone (checked at the edge), so some request
  completes and admission resumes.

When nothing outside a replica can change its course any more (every request has arrived and
no stop is set), :meth:`Replica.plan_out` plans its remaining runs on integers alone (which
request runs in which step depends only on step counts, never on times) into a
:class:`RunLog`; :mod:`rlperf.stages.rollout_runout` then times them, with the same result.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from rlperf.stages.request_status import DECODING, DONE, PREFILL, WAITING
from rlperf.stages.rollout_requests import GroupIndex
from rlperf.stages.rollout_result import SegmentLog
from rlperf.stages.rollout_step import Coef, Count, Run, StepModel


class Book:
    """Per-request state shared by the replicas of one call (plain lists: fast scalar access).

    Each list is made on first use, from the call's arrays as built (prompt, response, target,
    generated, group) or its initial value (the others): the compiled run-out reads the arrays
    and settles the call on arrays (``settled``), so a call it runs whole never needs most of
    them (a list of 10k entries costs ~0.15 ms to make from an array, ~0.6 to read back)."""

    prompt: list[int]
    response: list[int]  # full response length
    target: list[int]  # tokens the request stops at in this call
    generated: list[int]  # generated so far (valid while not decoding)
    group: list[int]
    status: list[int]
    finish_s: list[float]
    join_step: list[int]
    private_kv: list[int]  # KV tokens of the request not shared with its group
    order: list[int]  # join sequence number (stale-heap-entry check)

    def __init__(self, arrays: BookArrays, groups: GroupIndex) -> None:
        self.arrays = arrays
        self.groups = groups  # arrays.group sorted (rlperf.stages.rollout_requests.GroupIndex)
        self.num_requests = len(arrays.prompt)
        self.num_finished = 0  # requests that reached their full response
        # Requests finished since the driver last looked (group admission only: None otherwise).
        self.done_log: list[int] | None = None
        # The call's outcome as arrays when the compiled run-out settled it itself (the lists
        # above are then not brought up to date: the call is over).
        self.settled: Settled | None = None

    if not TYPE_CHECKING:  # the lists' types are declared above

        def __getattr__(self, name: str) -> list[int] | list[float]:
            """A list not made yet (Python calls this only for a missing attribute)."""
            if name in _FROM_ARRAYS:
                values = getattr(self.arrays, name).tolist()
            elif name in _INITIAL:
                values = [_INITIAL[name]] * self.num_requests
            else:
                raise AttributeError(name)
            setattr(self, name, values)
            return values

    def made(self, name: str) -> bool:
        """Whether list ``name`` was made (read or written) yet."""
        return name in vars(self)

    def finish_array(self) -> np.ndarray:
        """``finish_s`` as an array (every request unfinished while the list was never made)."""
        if self.made("finish_s"):
            return np.array(self.finish_s, np.float64)
        return np.full(self.num_requests, math.inf)


_FROM_ARRAYS = frozenset(("prompt", "response", "target", "generated", "group"))
_INITIAL: dict[str, int | float] = {"status": WAITING, "finish_s": math.inf, "join_step": 0, "private_kv": 0,
                                    "order": 0}


@dataclass(frozen=True)
class Settled:
    """A call stopped and settled by the compiled run-out: every request's finish time (inf:
    unfinished) and generated tokens, and whether a replica was still busy at the stop (the
    call was cut short)."""

    finish_s: np.ndarray
    generated: np.ndarray
    cut: bool


@dataclass(frozen=True)
class BookArrays:
    """A call's :class:`Book` as arrays, as it was built (nothing run yet): the compiled
    run-out (rlperf.stages.rollout_kernel.CallPlanner) takes its columns from here instead of
    converting the book's lists (they hold the same values)."""

    prompt: np.ndarray
    response: np.ndarray
    target: np.ndarray
    generated: np.ndarray
    group: np.ndarray


@dataclass(frozen=True)
class Queues:
    """Waiting queues as arrays, for replicas whose own queues are empty (a call's first
    arrivals, queued straight into the compiled run-out): the requests, replica after replica
    in index order, each queue in order; and how many each replica holds (by index)."""

    requests: np.ndarray
    counts: np.ndarray


@dataclass
class ReplicaStats:
    """What one replica did (accumulated over its runs of steps)."""

    busy_s: float = 0.0
    last_end_s: float = 0.0
    flops: float = 0.0
    bytes_per_gpu: float = 0.0  # HBM traffic of one GPU, summed over the pp stages
    roofline_s: float = 0.0  # sum of max(compute, memory, floor), without communication
    num_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    segments: SegmentLog = field(default_factory=SegmentLog)


@dataclass
class RunLog:
    """The runs :meth:`Replica.plan_out` planned (not yet timed): per run, the arguments of
    :meth:`StepModel.run` and of the run's totals, and the requests that finished after it."""

    # (decoding sequences, their total context at the first step, steps, wave tokens prefilled
    # over the run, sequences in the wave, wave_s_per_token, wave_flops_per_token)
    runs: list[tuple[int, int, int, int, int, float, float]] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)  # requests, in the order they finished
    ends: list[int] = field(default_factory=list)  # len(finished) after each run


@dataclass(frozen=True)
class RunArrays:
    """Planned runs as arrays (one entry per run, sorted by replica, each replica's in run
    order): :class:`RunLog`'s fields, and the run's replica (its position in the list of
    replicas being timed)."""

    replica: np.ndarray
    num_decode: np.ndarray
    context: np.ndarray  # total context at the run's first step
    num_steps: np.ndarray
    chunk: np.ndarray  # wave tokens prefilled over the run
    num_wave: np.ndarray
    wave_s_per_token: np.ndarray
    wave_flops_per_token: np.ndarray


class Replica:
    """One engine replica: a waiting queue, a prefill wave, and the decoding batch."""

    def __init__(
        self,
        index: int,
        step: StepModel,
        book: Book,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefix_sharing: bool,
    ) -> None:
        self.index = index
        self.step = step
        self.book = book
        self.cap = kv_capacity_tokens
        self.max_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.sharing = prefix_sharing
        self.t = 0.0
        self.S = 0  # steps done
        self.waiting: deque[int] = deque()
        self.heap: list[tuple[int, int, int]] = []  # (finish step, join order, request)
        self.stack: list[int] = []  # decoding requests in join order (preemption victims)
        self.b = 0
        self.ctx_fixed = 0  # C(S) = ctx_fixed + b·S
        self.kv_fixed = 0  # KV(S) = kv_fixed + b·S
        self.group_resident: dict[int, int] = {}
        self.wave: list[int] = []
        self.wave_left = 0  # prefill tokens not yet processed
        self.wave_s_per_token = 0.0
        self.wave_flops_per_token = 0.0
        self.blocked = False
        self.next_order = 0
        # the planned run
        self.plan: Run | None = None
        self.plan_n = 0
        self.plan_s = 0.0
        self.plan_chunk = 0
        self.stats = ReplicaStats()
        self.log: RunLog | None = None  # set while plan_out plans without times

    # ------------------------------------------------------------------ queries
    @property
    def occupied(self) -> int:
        return self.b + len(self.wave)

    @property
    def load(self) -> int:
        """Unfinished requests on this replica (for least-loaded dispatch)."""
        return len(self.waiting) + self.b + len(self.wave)

    @property
    def busy(self) -> bool:
        return self.b > 0 or bool(self.wave)

    def kv_used(self) -> int:
        return self.kv_fixed + self.b * self.S

    def could_admit(self) -> bool:
        return not self.wave and not self.blocked and self.occupied < self.max_seqs

    # ------------------------------------------------------------------ events at step S
    def events(self) -> None:
        """Apply everything that happens at the current step boundary, in order: the wave
        joins the decoding batch, completions leave, KV overflow preempts, admission."""
        if self.wave and self.wave_left == 0:
            self._join_wave()
        heap, S = self.heap, self.S
        while heap and heap[0][0] <= S:
            _, order, i = heapq.heappop(heap)
            if self.book.status[i] == DECODING and self.book.order[i] == order:
                self._leave(i)
                self._finish(i)
        while self.b and self.kv_fixed + self.b * (S + 1) > self.cap:
            self._preempt()
        if not self.busy:
            self.blocked = False
        if not self.wave and not self.blocked and self.waiting and self.b < self.max_seqs:
            self._admit()

    def resume(self, i: int) -> bool:
        """Request ``i`` (first in the waiting queue, its KV still cached: the previous call
        stopped while it decoded and no weight update came between) goes on decoding at this
        step without a prefill: it joins the batch with its ``prompt + generated`` tokens of
        context and KV, as :meth:`_admit` and :meth:`_join_wave` would after re-prefilling it,
        but samples no token (its next one comes from the next decode step). False, leaving it
        queued (to be re-prefilled), when a wave is in flight, the slots are taken or the KV
        cache cannot hold it and the batch's next tokens."""
        bk, S = self.book, self.S
        p, gen, g = bk.prompt[i], bk.generated[i], bk.group[i]
        shared = self.sharing and g in self.group_resident
        need = (0 if shared else p) + gen
        if self.wave or self.b >= self.max_seqs or need + self.b + 1 > self.cap - self.kv_used():
            return False
        self.waiting.popleft()
        if self.sharing:
            self.group_resident[g] = self.group_resident.get(g, 0) + 1
        bk.private_kv[i] = gen + (0 if self.sharing else p)
        bk.status[i] = DECODING
        bk.join_step[i] = S
        bk.order[i] = self.next_order
        heapq.heappush(self.heap, (S + bk.target[i] - gen, self.next_order, i))
        self.next_order += 1
        self.b += 1
        self.ctx_fixed += p + gen - S
        self.kv_fixed += need - S  # growth counted from now by b·S
        self.stack.append(i)
        return True

    def _join_wave(self) -> None:
        bk, S, wave = self.book, self.S, self.wave
        generated, heap, order = bk.generated, self.heap, self.next_order
        status, join_step, order_of, prompt, target = bk.status, bk.join_step, bk.order, bk.prompt, bk.target
        ctx = 0
        # Keys (finish step, join order, request) are distinct, so the heap pops the same
        # sequence whether the wave is pushed one by one or added and heapified (O(n), for the
        # first wave of hundreds of requests).
        joined = []
        for i in wave:
            gen = generated[i] + 1  # the last prefill step samples the first token
            generated[i] = gen
            status[i] = DECODING
            join_step[i] = S
            order_of[i] = order
            ctx += prompt[i] + gen - S
            joined.append((S + target[i] - gen, order, i))
            order += 1
        n = len(wave)
        if n > 8 and 2 * n >= len(heap):
            heap.extend(joined)
            heapq.heapify(heap)
        else:
            for item in joined:
                heapq.heappush(heap, item)
        self.stats.decode_tokens += n
        self.next_order = order
        self.b += n
        self.ctx_fixed += ctx
        self.kv_fixed -= n * S  # growth counted from now by b·S
        self.stack.extend(wave)
        self.wave = []

    def _leave(self, i: int) -> None:
        """Remove decoding request ``i`` from the batch at step S, fixing its count."""
        bk, S = self.book, self.S
        j = bk.join_step[i]
        bk.generated[i] += S - j
        self.b -= 1
        self.ctx_fixed -= bk.prompt[i] + bk.generated[i] - (S - j) - j
        self.kv_fixed -= bk.private_kv[i] - j
        self._release_group(i)

    def _finish(self, i: int) -> None:
        bk = self.book
        bk.status[i] = DONE
        bk.finish_s[i] = self.t
        if self.log is not None:  # plan_out: the time is known once the runs are timed
            self.log.finished.append(i)
        if bk.generated[i] == bk.response[i]:
            bk.num_finished += 1
        if bk.done_log is not None:
            bk.done_log.append(i)
        self.blocked = False

    def _preempt(self) -> None:
        bk = self.book
        while True:
            i = self.stack.pop()
            if bk.status[i] == DECODING:
                break
        self._leave(i)
        bk.status[i] = WAITING
        self.waiting.appendleft(i)
        self.blocked = True
        self.stats.preemptions += 1

    def _release_group(self, i: int) -> None:
        if not self.sharing:
            return
        g = self.book.group[i]
        left = self.group_resident[g] - 1
        if left:
            self.group_resident[g] = left
        else:
            del self.group_resident[g]
            self.kv_fixed -= self.book.prompt[i]

    def _admit(self) -> None:
        bk, waiting, wave, sharing, resident = self.book, self.waiting, self.wave, self.sharing, self.group_resident
        prompt, generated, group = bk.prompt, bk.generated, bk.group
        kv_free = self.cap - self.kv_used() - self.b  # the running batch's next tokens come first
        free_slots = self.max_seqs - self.b - len(wave)
        tokens = kv_added = 0
        pairs = 0.0
        while waiting and free_slots > 0:
            i = waiting[0]
            p, gen, g = prompt[i], generated[i], group[i]
            shared = sharing and g in resident
            need = (0 if shared else p) + gen + 1  # (its prompt unless resident) + its tokens + 1
            if need > kv_free:
                break
            waiting.popleft()
            kv_free -= need
            kv_added += need
            free_slots -= 1
            if sharing:
                resident[g] = resident.get(g, 0) + 1
            bk.private_kv[i] = gen + 1 + (0 if sharing else p)
            bk.status[i] = PREFILL
            # Tokens to prefill after ``cached`` tokens already in the cache (>= 1 for logits).
            new, cached = (gen, p) if shared else (p + gen, 0)
            if new == 0:
                new, cached = 1, p - 1
            tokens += new
            pairs += new * cached + 0.5 * new * (new + 1)
            wave.append(i)
        self.kv_fixed += kv_added
        if wave:
            n = len(self.wave)
            self.wave_left = tokens
            self.wave_s_per_token = self.step.prefill_s_per_token(tokens, pairs, n)
            self.wave_flops_per_token = self.step.prefill_flops(tokens, pairs, n) / tokens

    # ------------------------------------------------------------------ runs of steps
    def plan_next(self) -> float:
        """Plan the run up to the next event; return its end time (inf when idle)."""
        if not self._plan_steps():
            self.plan = None
            return math.inf
        b, n = self.b, self.plan_n
        self.plan = self.step.run(
            b, self.ctx_fixed + b * self.S, self.plan_chunk / n, self.wave_s_per_token, len(self.wave)
        )
        self.plan_s = self.plan.time_s(n)
        return self.t + self.plan_s

    def _plan_steps(self) -> bool:
        """Set ``plan_n``, the steps up to the next event, and ``plan_chunk``, the prefill
        tokens they carry; False when idle."""
        if not self.busy:
            return False
        b, S = self.b, self.S
        n = 1 << 62
        if b:
            heap, bk = self.heap, self.book
            while bk.status[heap[0][2]] != DECODING or bk.order[heap[0][2]] != heap[0][1]:
                heapq.heappop(heap)
            n = min(heap[0][0] - S, (self.cap - self.kv_used()) // b)
        chunk = 0
        if self.wave:
            per_step = self.budget - b
            n = min(n, -(-self.wave_left // per_step))
            chunk = min(self.wave_left, n * per_step)
        assert n >= 1, (self.index, n)
        self.plan_n = n
        self.plan_chunk = chunk
        return True

    def commit(self, m: int) -> None:
        """Run the first ``m`` steps of the plan."""
        plan = self.plan
        assert plan is not None and 0 <= m <= self.plan_n
        if m == 0:
            return
        b, S = self.b, self.S
        dt = self.plan_s if m == self.plan_n else plan.time_s(m)
        tokens = min(self.wave_left, m * (self.budget - b)) if self.wave else 0
        flops, num_bytes = run_totals(
            self.step, b, self.ctx_fixed + b * S, m, tokens, b + -(-self.plan_chunk // self.plan_n),
            b + len(self.wave), self.wave_flops_per_token,
        )
        self.stats.flops += float(flops)
        self.stats.bytes_per_gpu += float(num_bytes)
        self.stats.roofline_s += dt - m * plan.fixed
        self.stats.segments.append(self.t, self.t + dt, self.occupied, bool(self.wave))
        self.stats.busy_s += dt
        self.t += dt
        self.stats.last_end_s = self.t
        self._advance(m, tokens)
        self.plan = None

    def _advance(self, m: int, tokens: int) -> None:
        """The step counts of ``m`` steps that prefill ``tokens`` wave tokens."""
        self.wave_left -= tokens
        self.stats.prefill_tokens += tokens
        self.stats.decode_tokens += self.b * m
        self.stats.num_steps += m
        self.S += m

    def plan_out(self, may_drain: bool, debug: bool, max_runs: int | None = None) -> bool:
        """Plan runs on integers into ``self.log`` (no times) from the current step, as
        committing and replanning event by event would, until idle (False) or, if
        ``may_drain``, until only decoding sequences are left (True: see
        :func:`rlperf.stages.rollout_runout.drain`). ``may_drain`` comes back on once the
        replica has been out of that state (after a failed drain, admissions must happen
        first). ``max_runs``: stop (False) once the log holds that many runs, never
        draining."""
        log = self.log
        assert log is not None
        self.plan = None  # its run is planned again below, on integers
        if max_runs is not None:
            may_drain = False
        limit = (1 << 62) if max_runs is None else max_runs
        while True:
            if self.blocked and self.b and not self.wave and self._plan_storm(log, limit, debug):
                may_drain = max_runs is None  # the storm's runs leave requests waiting
            if len(log.runs) >= limit or not self._plan_steps():
                break
            b, n, chunk = self.b, self.plan_n, self.plan_chunk
            log.runs.append((b, self.ctx_fixed + b * self.S, n, chunk, len(self.wave), self.wave_s_per_token,
                             self.wave_flops_per_token))
            self._advance(n, chunk)
            self.events()
            log.ends.append(len(log.finished))
            if debug:
                self.check()
            decode_only = self.b > 0 and not self.wave and not self.waiting
            if decode_only and may_drain:
                return True
            may_drain = max_runs is None and (may_drain or not decode_only)
        return False

    def _plan_storm(self, log: RunLog, limit: int, debug: bool) -> bool:
        """Plan the runs of a preemption storm into ``log`` (at most ``limit`` runs in all);
        True if it planned any. While the replica is blocked (admission waits for a
        completion) with no wave in flight, every run ends where the KV cache is full, before
        the next completion, and its events are the preemptions alone (vLLM evicts the newest
        sequence until the next step fits). This is :meth:`plan_out`'s loop for exactly those
        runs (:meth:`_plan_steps`, :meth:`_advance`, :meth:`events`, :meth:`_preempt`,
        :meth:`_leave`), written out on local variables: a storm runs one to ten of them per
        completion (the fully-async DAPO 30B-A3B calls: 24k-58k)."""
        bk = self.book
        status, order, generated, join_step = bk.status, bk.order, bk.generated, bk.join_step
        prompt, private_kv, group = bk.prompt, bk.private_kv, bk.group
        heap, stack, waiting, resident, sharing = self.heap, self.stack, self.waiting, self.group_resident, self.sharing
        runs, ends, finished = log.runs, log.ends, log.finished
        cap, S, b, ctx_fixed, kv_fixed = self.cap, self.S, self.b, self.ctx_fixed, self.kv_fixed
        wave_s, wave_flops = self.wave_s_per_token, self.wave_flops_per_token
        steps = decoded = preempted = 0
        while b and len(runs) < limit:
            top = heap[0]
            while status[top[2]] != DECODING or order[top[2]] != top[1]:
                heapq.heappop(heap)
                top = heap[0]
            n = (cap - kv_fixed - b * S) // b
            if n >= top[0] - S:  # a completion is due first (or with the overflow): plan_out's loop
                break
            runs.append((b, ctx_fixed + b * S, n, 0, 0, wave_s, wave_flops))
            S += n
            steps += n
            decoded += b * n
            while b and kv_fixed + b * (S + 1) > cap:
                i = stack.pop()
                while status[i] != DECODING:
                    i = stack.pop()
                j = join_step[i]
                gen = generated[i] + S - j
                generated[i] = gen
                b -= 1
                ctx_fixed -= prompt[i] + gen - S
                kv_fixed -= private_kv[i] - j
                if sharing:
                    g = group[i]
                    left = resident[g] - 1
                    if left:
                        resident[g] = left
                    else:
                        del resident[g]
                        kv_fixed -= prompt[i]
                status[i] = WAITING
                waiting.appendleft(i)
                preempted += 1
            self.S, self.b, self.ctx_fixed, self.kv_fixed = S, b, ctx_fixed, kv_fixed
            if not b:  # events() ends with the replica idle: unblocked, it admits
                self.blocked = False
                self._admit()
            ends.append(len(finished))
            if debug:
                self.check()
        st = self.stats
        st.decode_tokens += decoded
        st.num_steps += steps
        st.preemptions += preempted
        return steps > 0

    def run_until(self, t_s: float, round_up: bool) -> None:
        """Commit the steps of the plan done by ``t_s`` (``round_up``: through the step that
        is running at ``t_s``)."""
        if self.plan is None:
            return
        m = self.plan.steps_within(t_s - self.t, self.plan_n, round_up)
        self.commit(m)

    def settle_stopped(self) -> None:
        """At a stop: record completions due now and fix the counts of running requests."""
        if self.wave and self.wave_left == 0:
            self._join_wave()
        bk, S = self.book, self.S
        if self.log is None and bk.done_log is None:
            self._settle_all(S)
            return
        while self.heap:
            s, order, i = heapq.heappop(self.heap)
            if bk.status[i] != DECODING or bk.order[i] != order:
                continue
            self._leave(i)
            if s <= S:
                self._finish(i)
            else:
                bk.status[i] = WAITING

    def _settle_all(self, S: int) -> None:
        """:meth:`settle_stopped`'s loop when nothing records the order of finishes (no run
        log, no group gate): every decoding request leaves at once, so the heap is read as a
        list instead of popped (each live entry once, whatever the order: a stale entry's
        request is no longer decoding under that join order), with :meth:`_leave`,
        ``_release_group`` and :meth:`_finish` written inline; the counts are sums, the same
        in any order (a group's members share its prompt)."""
        bk, t, sharing, resident = self.book, self.t, self.sharing, self.group_resident
        status, order_of, join_step, generated = bk.status, bk.order, bk.join_step, bk.generated
        prompt, private_kv, group, response, finish_s = bk.prompt, bk.private_kv, bk.group, bk.response, bk.finish_s
        left = ctx = kv = finished = 0
        any_done = False
        for s, order, i in self.heap:
            if status[i] != DECODING or order_of[i] != order:
                continue
            j = join_step[i]
            gen = generated[i] + S - j
            generated[i] = gen
            left += 1
            ctx += prompt[i] + gen - S
            kv += private_kv[i] - j
            if sharing:
                g = group[i]
                n = resident[g] - 1
                if n:
                    resident[g] = n
                else:
                    del resident[g]
                    kv += prompt[i]
            if s <= S:
                status[i] = DONE
                finish_s[i] = t
                finished += gen == response[i]
                any_done = True
            else:
                status[i] = WAITING
        self.heap.clear()
        self.b -= left
        self.ctx_fixed -= ctx
        self.kv_fixed -= kv
        bk.num_finished += finished
        if any_done:
            self.blocked = False

    def check(self) -> None:
        """Debug: recompute the KV in use and the batch from scratch."""
        bk, S = self.book, self.S
        dec = [i for i in set(self.stack) if bk.status[i] == DECODING]
        kv = sum(bk.private_kv[i] + S - bk.join_step[i] for i in dec)
        kv += sum(bk.private_kv[i] for i in self.wave)
        kv += sum(bk.prompt[self._member(g)] for g in self.group_resident) if self.sharing else 0
        assert len(dec) == self.b, (len(dec), self.b)
        assert kv == self.kv_used(), (kv, self.kv_used())
        assert kv <= self.cap, (kv, self.cap)
        assert self.occupied <= self.max_seqs
        ctx = sum(bk.prompt[i] + bk.generated[i] + S - bk.join_step[i] for i in dec)
        assert ctx == self.ctx_fixed + self.b * S, (ctx, self.ctx_fixed + self.b * S)

    def _member(self, g: int) -> int:
        bk = self.book
        for i in list(self.stack) + self.wave:
            if bk.group[i] == g and bk.status[i] in (PREFILL, DECODING):
                return i
        raise AssertionError(f"group {g} resident without members")


def run_totals(
    step: StepModel, b: Count, context: Count, m: Count, tokens: Count, n_tok: Count, num_seqs: Count,
    prefill_flops_per_token: Coef,
) -> tuple[Coef, Coef]:
    """(FLOPs, HBM bytes per GPU) of ``m`` steps of ``b`` decodes from total context
    ``context`` that also prefill ``tokens`` wave tokens (``n_tok`` tokens per step over
    ``num_seqs`` sequences), for one run or arrays of runs."""
    ctx_sum = m * context + b * 0.5 * m * (m - 1)
    flops = step.decode_flops(b * m, ctx_sum) + prefill_flops_per_token * tokens
    mb = step.num_microbatches(num_seqs)  # each micro-batch streams the weights
    weights = mb * step.weight_bytes_per_gpu(-(-n_tok // mb))
    return flops, m * weights + step.kv_bytes_per_token_per_gpu * (ctx_sum + b * m + tokens)

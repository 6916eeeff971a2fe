"""Static batching on engine replicas: fixed batches that run until their longest request ends.

HF ``generate`` (the reference runtime), TRT-LLM's static micro-batches in NeMo-Aligner and
DeepSpeed-Chat's hybrid engine generate this way. A replica takes the requests dispatched to it
in order, at most ``max_num_seqs`` at a time (those waiting when it is free), and runs the
batch as one prefill step over the prompts padded to the batch's longest, then decode steps
with the whole batch until its longest response is done: a row whose response has ended keeps
computing padding (``generate`` stops only when every row is done). Every request of a batch is
returned when the batch ends.

With ``b`` requests, ``P`` the batch's longest context (prompt plus tokens generated in an
earlier call) and ``R`` its longest number of new tokens, a batch is two closed-form runs of
:class:`rlperf.stages.rollout_step.StepModel`:

    prefill = step.run(0, 0, b·P, prefill_s_per_token(b·P, b·P(P+1)/2, b)).time_s(1)
    decode  = step.run(b, b·(P+1), 0, 0).time_s(R - 1)

(the prefill samples the first token; each decode step reads the padded context of every row).
There is no prefix sharing (each row prefills its own prompt), no chunked prefill and no
preemption: the KV cache must hold the padded batch, ``b·(P + R)`` tokens, else the layout is
rejected. Stops (time limits, finished-count targets) need continuous batching.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlperf.errors import SpecError
from rlperf.stages.rollout_engine import ReplicaStats, run_totals
from rlperf.stages.rollout_requests import RolloutRequests
from rlperf.stages.rollout_step import StepModel


@dataclass
class StaticReplica:
    """One replica of a static-batching engine: its queue and the batch it is running."""

    index: int
    waiting: deque[int] = field(default_factory=deque)
    running: int = 0  # requests of the batch in flight
    stats: ReplicaStats = field(default_factory=ReplicaStats)

    @property
    def load(self) -> int:
        """Unfinished requests on this replica (for least-loaded dispatch)."""
        return len(self.waiting) + self.running


@dataclass(frozen=True)
class StaticOutcome:
    finish_s: np.ndarray  # per request: when its batch ended
    replica_of: np.ndarray
    stats: list[ReplicaStats]


def run_static(
    step: StepModel,
    requests: RolloutRequests,
    target: np.ndarray,
    max_num_seqs: int,
    kv_capacity: int,
    replicas: list[StaticReplica],
    choose: Callable[[int], StaticReplica],
) -> StaticOutcome:
    """Run every request to ``target`` tokens in static batches (``choose`` dispatches a request
    on arrival). Events in time order: batches that end, then arrivals, then idle replicas start
    their next batch."""
    n = requests.num_requests
    arrival = requests.arrival_s.tolist()
    order = np.argsort(requests.arrival_s, kind="stable").tolist()
    finish = np.full(n, math.inf)
    replica_of = np.full(n, -1, np.int64)
    ends: list[tuple[float, int]] = []
    ptr = 0
    while ptr < n or ends:
        t = min(arrival[order[ptr]] if ptr < n else math.inf, ends[0][0] if ends else math.inf)
        while ends and ends[0][0] == t:
            replicas[heapq.heappop(ends)[1]].running = 0
        while ptr < n and arrival[order[ptr]] == t:
            i = order[ptr]
            r = choose(i)
            r.waiting.append(i)
            replica_of[i] = r.index
            ptr += 1
        for r in replicas:
            if r.running == 0 and r.waiting:
                batch = [r.waiting.popleft() for _ in range(min(max_num_seqs, len(r.waiting)))]
                end = _run_batch(step, requests, target, batch, kv_capacity, r, t)
                finish[batch] = end
                r.running = len(batch)
                heapq.heappush(ends, (end, r.index))
    return StaticOutcome(finish, replica_of, [r.stats for r in replicas])


def _run_batch(
    step: StepModel,
    requests: RolloutRequests,
    target: np.ndarray,
    batch: list[int],
    kv_capacity: int,
    r: StaticReplica,
    t: float,
) -> float:
    """Run one batch on ``r`` from time ``t``; record its figures; return its end."""
    b = len(batch)
    done = requests.already_generated[batch]
    context = int(np.max(requests.prompt_tokens[batch] + done))  # P: padded context
    new = target[batch] - done
    longest = int(np.max(new))  # R
    if b * (context + longest) > kv_capacity:
        raise SpecError(
            "engine.max_num_seqs",
            f"a static batch of {b} requests padded to {context} + {longest} tokens needs "
            f"{b * (context + longest)} tokens of KV cache; a replica holds {kv_capacity}",
            "a smaller max_num_seqs, a larger engine (tp/pp) or more gpu_memory_utilization",
        )
    tokens, pairs = b * context, b * 0.5 * context * (context + 1)
    prefill = step.run(0, 0, tokens, step.prefill_s_per_token(tokens, pairs, b), b)
    decode = step.run(b, b * (context + 1), 0, 0.0)
    pre_s, dec_s = prefill.time_s(1), decode.time_s(longest - 1)
    st = r.stats
    per_token = step.prefill_flops(tokens, pairs, b) / tokens
    for run, dt, args in (
        (prefill, pre_s, (0, 0, 1, tokens, tokens, b, per_token)),
        (decode, dec_s, (b, b * (context + 1), longest - 1, 0, b, b, 0.0)),
    ):
        flops, num_bytes = run_totals(step, *args)
        st.flops += float(flops)
        st.bytes_per_gpu += float(num_bytes)
        st.roofline_s += dt - args[2] * run.fixed
    st.segments.append(t, t + pre_s, b, True)
    if longest > 1:
        st.segments.append(t + pre_s, t + pre_s + dec_s, b, False)
    st.busy_s += pre_s + dec_s
    st.last_end_s = t + pre_s + dec_s
    st.num_steps += longest
    st.prefill_tokens += tokens
    st.decode_tokens += int(np.sum(new))
    return st.last_end_s

"""What a rollout call returns: per-request times and counts, per-replica figures, tail
metrics, work and depth, and a timeline for the Chrome trace."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, Literal, TypeVar, cast

import numpy as np

SegmentKind = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class TimelineSegment:
    """A run of engine steps on one replica with a fixed batch.

    ``kind`` is ``"prefill"`` for steps that also prefill prompt chunks (chunked prefill mixed
    with the running decodes) and ``"decode"`` for pure decode steps. ``batch_size`` counts the
    occupied slots: decoding sequences plus those being prefilled."""

    replica: int
    start_s: float
    end_s: float
    batch_size: int
    kind: SegmentKind


T = TypeVar("T")


class _Column(Generic[T]):
    """A list column of :class:`SegmentLog` (its slot ``_name``), brought up to date with the
    runs appended as arrays when read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, log: SegmentLog, owner: type) -> list[T]:
        if log._pending:
            log._flush()
        return cast("list[T]", getattr(log, self.slot))


class SegmentLog:
    """One replica's timeline segments as columns, appended run by run (the event-by-event
    path) or many runs at once as arrays (the run-out); made lists when read as lists, and
    :class:`TimelineSegment` objects only when a trace reads them. One object per engine run
    cost a quarter of a planner's rollout simulation (README plan: 1.0 of 3.9 CPU-s), and a
    planner reads none of them but the critical replica's occupancy (:meth:`arrays`)."""

    __slots__ = ("_batch_size", "_end_s", "_pending", "_prefill", "_start_s")

    def __init__(self) -> None:
        self._start_s: list[float] = []
        self._end_s: list[float] = []
        self._batch_size: list[int] = []
        self._prefill: list[bool] = []
        # Runs appended as arrays and not yet read as lists: (start, end, batch size, prefill).
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def _flush(self) -> None:
        for start, end, size, prefill in self._pending:
            self._start_s.extend(start.tolist())
            self._end_s.extend(end.tolist())
            self._batch_size.extend(size.tolist())
            self._prefill.extend(prefill.tolist())
        self._pending.clear()

    start_s: _Column[float] = _Column()
    end_s: _Column[float] = _Column()
    batch_size: _Column[int] = _Column()
    prefill: _Column[bool] = _Column()

    def __len__(self) -> int:
        return len(self._start_s) + sum(len(p[0]) for p in self._pending)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SegmentLog) and all(
            getattr(self, k) == getattr(other, k) for k in ("start_s", "end_s", "batch_size", "prefill"))

    __hash__ = None  # type: ignore[assignment]  # mutable while the replica runs

    def append(self, start_s: float, end_s: float, batch_size: int, prefill: bool) -> None:
        if self._pending:  # after runs kept as arrays (a stop's run in progress): one more such run
            self._pending.append((np.array([start_s]), np.array([end_s]), np.array([batch_size], np.int64),
                                  np.array([prefill])))
            return
        self._start_s.append(start_s)
        self._end_s.append(end_s)
        self._batch_size.append(batch_size)
        self._prefill.append(prefill)

    def extend_arrays(self, start_s: np.ndarray, end_s: np.ndarray, batch_size: np.ndarray, prefill: np.ndarray) -> None:
        """Append runs given as arrays (float64, float64, int64, bool; not written to after)."""
        self._pending.append((start_s, end_s, batch_size, prefill))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start_s, end_s, batch_size) as arrays (the values of the lists)."""
        if not self._start_s and len(self._pending) == 1:
            start, end, size, _ = self._pending[0]
            return start, end, size
        if not self._start_s:
            start, end, size, _ = (np.concatenate(c) for c in zip(*self._pending))
            return start, end, size
        return np.array(self.start_s, np.float64), np.array(self.end_s, np.float64), np.array(self.batch_size, np.int64)

    def objects(self, replica: int) -> list[TimelineSegment]:
        kinds: list[SegmentKind] = ["prefill" if p else "decode" for p in self.prefill]
        return [TimelineSegment(replica, a, b, n, k)
                for a, b, n, k in zip(self.start_s, self.end_s, self.batch_size, kinds)]


@dataclass(frozen=True, eq=False)
class RolloutResult:
    """Outcome of one rollout call. Times are seconds from the call's start (t = 0)."""

    makespan_s: float  # when the call returns: the last replica drained, or the stop time
    stopped_early: bool  # a time limit or a finished-count target ended the call
    finish_time_s: (
        np.ndarray
    )  # per request (input order): when it left the engine; inf if it had not
    generated_tokens: np.ndarray  # per request: total generated, incl. ``already_generated``
    finished: np.ndarray  # per request: generated the whole response
    replica_of: np.ndarray  # per request: replica it was dispatched to (-1: never arrived)
    replica_busy_s: np.ndarray  # per replica: time spent running steps
    replica_finish_s: np.ndarray  # per replica: end of its last step (0 if it never ran)
    num_prefill_tokens: (
        int  # prompt and recomputed tokens prefilled (resume and preemption included)
    )
    num_decode_tokens: int  # tokens generated in this call
    num_steps: int  # engine steps summed over replicas (mixed prefill steps included)
    num_preemptions: int  # recompute preemptions (KV cache full)
    tail_s: float  # from the 90%-of-requests-finished point to the end (Seer: last 10% of requests)
    critical_replica: int  # the replica that finished last
    below_25pct_slots_s: float  # time the critical replica had < 25% of max_num_seqs occupied
    below_10pct_slots_s: float  # ... < 10%
    total_flops: float
    total_hbm_bytes: float  # bytes read and written in HBM, all GPUs
    work_s: float  # GPU-seconds at the roofline rate: sum of max(compute, memory), all GPUs
    depth_s: float  # the slowest request alone at batch 1: its prefill plus decode (lower bound)
    decode_depth_s: float  # the decode part of that bound (longest decode alone)
    num_gpus: int
    gpus_per_replica: int
    timeline: tuple[SegmentLog, ...]  # per replica, by index

    @cached_property
    def segments(self) -> tuple[TimelineSegment, ...]:
        """Every replica's timeline segments, replica after replica."""
        return tuple(s for r, log in enumerate(self.timeline) for s in log.objects(r))

    @property
    def num_requests(self) -> int:
        return int(len(self.finish_time_s))

    @property
    def decode_tokens_per_s(self) -> float:
        return self.num_decode_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def lower_bound_s(self) -> float:
        """max(W/P, D): no schedule of this work on these GPUs is faster (work-depth)."""
        return max(self.work_s / self.num_gpus, self.depth_s)

    def chrome_trace_events(
        self, pid: int = 0, name_prefix: str = "rollout"
    ) -> list[dict[str, object]]:
        """Complete events ("ph": "X", microseconds), one track per replica (Perfetto)."""
        events: list[dict[str, object]] = []
        for s in self.segments:
            events.append(
                {
                    "name": f"{name_prefix} {s.kind}",
                    "ph": "X",
                    "ts": s.start_s * 1e6,
                    "dur": (s.end_s - s.start_s) * 1e6,
                    "pid": pid,
                    "tid": s.replica,
                    "args": {"batch_size": s.batch_size},
                }
            )
        return events


def tail_after_fraction_s(
    finish_time_s: np.ndarray, makespan_s: float, fraction: float = 0.9
) -> float:
    """Time from the point where ``fraction`` of all requests had finished to the end
    (0 if fewer than that fraction finished)."""
    n = len(finish_time_s)
    k = max(1, math.ceil(fraction * n))
    done = finish_time_s[np.isfinite(finish_time_s)]
    if len(done) < k:
        return 0.0
    return max(0.0, makespan_s - float(np.partition(done, k - 1)[k - 1]))  # the k-th earliest


def low_occupancy_s(segments: SegmentLog, end_s: float, slots: float) -> float:
    """Time in ``[first start, end_s]`` during which fewer than ``slots`` slots are occupied;
    gaps between segments count as empty."""
    if not len(segments):
        return 0.0
    start, stop, occ = segments.arrays()
    covered = float(np.sum(stop - start))
    gaps = max(0.0, (end_s - float(start.min())) - covered)
    return float(np.sum((stop - start)[occ < slots])) + gaps

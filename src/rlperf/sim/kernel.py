"""A tiny deterministic discrete-event kernel for tasks on GPU pools.

Why not SimPy: the simulator needs only (a) tasks that wait for events and for GPUs of one or
more pools, (b) tasks that release their GPUs progressively (a rollout's replicas drain one by
one), and (c) bit-for-bit determinism. A heap ordered by (time, sequence number) gives that in
~150 lines with no global state (aesthetics.md P5).

Scheduling rule: whenever an event fires, ready tasks are considered in priority order and each
one that fits in the free GPUs starts (priority order with backfilling). Priorities are tuples
(iteration, stage order, chunk), so the schedule is a deterministic list schedule.

Held tasks (:meth:`Kernel.hold`): the tasks of the iterations a longer run would add wait, and
the kernel keeps its state at the first moment one of them would have started; up to there the
two runs are the same, so the longer run can go on from that checkpoint (rlperf.sim.simulate
extends a warm-up that way instead of simulating the run again).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    """A span on a timeline track (for the Chrome trace and utilization): ``[start_s, end_s)``
    on ``gpus`` GPUs of iteration ``iteration``; ``args`` are extra numbers for the trace."""

    track: str  # e.g. "rollout/replica-3" or "train"
    name: str
    start_s: float
    end_s: float
    gpus: int
    iteration: int
    args: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class TaskRun:
    """What a task does once started: its duration, progressive releases and milestones.

    A task granted ``g_p`` GPUs of pool ``p`` holds ``g_p - Σ released`` until ``duration_s``
    and each released share from its offset on; milestones fire named events mid-run (a fusion
    wave waits for "k responses finished")."""

    duration_s: float
    # (offset_s, pool, gpus) released before the end (e.g. replicas that finished early).
    releases: tuple[tuple[float, str, int], ...] = ()
    # (offset_s, event) fired during the run (e.g. "25% of responses done").
    milestones: tuple[tuple[float, str], ...] = ()
    segments: tuple[Segment, ...] = ()
    payload: object = None


# What a task runs once it starts: (start time, GPUs granted per pool) -> what it does.
TaskFn = Callable[[float, dict[str, int]], TaskRun]


@dataclass
class Task:
    """A node of the schedule: it starts once every event in ``deps`` has fired and every pool
    in ``needs`` has at least its minimum free (elastic tasks take up to the maximum)."""

    name: str
    priority: tuple[int, ...]
    deps: tuple[str, ...]  # events that must have fired
    # pool -> (min GPUs, max GPUs). Elastic tasks get every free GPU up to max.
    needs: dict[str, tuple[int, int]]
    run: TaskFn
    iteration: int = 0
    # Filled by the kernel.
    start_s: float = math.nan
    end_s: float = math.nan
    granted: dict[str, int] = field(default_factory=dict)
    result: TaskRun | None = None


@dataclass(frozen=True)
class _Release:
    pool: str
    gpus: int


@dataclass(frozen=True)
class _Finish:
    task: Task
    rest: dict[str, int]  # GPUs given back per pool at the end


_HeapItem = _Release | str | _Finish  # a release, a named event, or a task's end


@dataclass(frozen=True)
class Checkpoint:
    """The kernel's state just before a pass (see :meth:`Kernel.hold`), and what the caller
    saved with it (``saved``). Containers are copies; tasks are shared (a task's fields are
    written once, when it starts, and :meth:`Kernel.restore` clears those of the tasks not
    started at the checkpoint)."""

    now: float
    seq: int
    heap: list[tuple[float, int, _HeapItem]]
    free: dict[str, int]
    fired: dict[str, float]
    done: list[Task]
    ready: list[tuple[tuple[int, ...], int, Task]]
    blocked: dict[str, list[Task]]
    missing: dict[str, int]
    unstarted: dict[str, Task]
    saved: object


class Kernel:
    """The event loop: ``add`` tasks, then ``run``; ``fired`` maps each event (a task's name
    once it finished, or a milestone) to its time; ``done`` lists finished tasks in order."""

    def __init__(self, pools: dict[str, int]) -> None:
        self.capacity = dict(pools)
        self.free = dict(pools)
        self.now = 0.0
        self._seq = 0
        # (time, sequence, what): ties broken by insertion order (determinism).
        self._heap: list[tuple[float, int, _HeapItem]] = []
        self.fired: dict[str, float] = {}
        self.done: list[Task] = []
        self._by_name: dict[str, Task] = {}
        # Tasks not started yet: those with every dependency fired (``_ready``, in the order a
        # pass considers them: priority, then the order they were added, as a stable sort of
        # the waiting tasks by priority gives), and, per event not fired yet, the tasks that
        # wait for it with how many of their events are still missing. A pass then looks at
        # the ready tasks only, not at every task of every iteration.
        self._ready: list[tuple[tuple[int, ...], int, Task]] = []
        self._blocked: dict[str, list[Task]] = {}
        self._missing: dict[str, int] = {}
        self._unstarted: dict[str, Task] = {}
        self._added: dict[str, int] = {}  # task -> the order it was added in
        # Held tasks (iteration >= held_from) do not start; see hold().
        self.held_from: int | None = None
        self._save: Callable[[], object] | None = None
        self.checkpoint: Checkpoint | None = None

    def add(self, task: Task) -> None:
        assert task.name not in self._by_name, f"duplicate task {task.name}"
        for pool, (lo, hi) in task.needs.items():
            assert pool in self.capacity, f"{task.name}: unknown pool {pool}"
            assert 0 <= lo <= hi <= self.capacity[pool], f"{task.name}: needs {lo}..{hi} of {pool}"
        self._added[task.name] = len(self._by_name)
        self._by_name[task.name] = task
        self._unstarted[task.name] = task
        missing = {d for d in task.deps if d not in self.fired}
        self._missing[task.name] = len(missing)
        for d in missing:
            self._blocked.setdefault(d, []).append(task)
        if not missing:
            self._make_ready(task)

    def task(self, name: str) -> Task:
        return self._by_name[name]

    def _push(self, t: float, item: _HeapItem) -> None:
        heapq.heappush(self._heap, (t, self._seq, item))
        self._seq += 1

    def _make_ready(self, task: Task) -> None:
        bisect.insort(self._ready, (task.priority, self._added[task.name], task))

    def _fire(self, event: str) -> None:
        """``event`` fired for the first time: the tasks waiting for it lose one missing event."""
        for task in self._blocked.pop(event, ()):
            left = self._missing[task.name] - 1
            self._missing[task.name] = left
            if not left:
                self._make_ready(task)

    # ------------------------------------------------------------------ held tasks
    def hold(self, from_iteration: int | None, save: Callable[[], object] | None = None) -> None:
        """Tasks of iteration ``from_iteration`` and later do not start (None: none held).

        They are the iterations a longer run of the same schedule would add: until the first
        pass in which one of them would start (were they all released), the run is the same
        with them held or not (a pass starts tasks in priority order, and a task's start
        depends only on the tasks before it in that pass). At the beginning of that pass the
        kernel keeps its state, with ``save()``, as :attr:`checkpoint`; :meth:`restore` then
        continues from there, as the longer run, with fewer iterations held."""
        self.held_from = from_iteration
        self._save = save
        self.checkpoint = None

    def _held(self, task: Task) -> bool:
        return self.held_from is not None and task.iteration >= self.held_from

    def _would_start_held(self) -> bool:
        """Whether a held task would start in this pass, were the held tasks released (the
        pass's starts, without running them: a grant depends only on the free GPUs)."""
        free = dict(self.free)
        for _, _, task in self._ready:
            if not all(free[p] >= lo for p, (lo, _) in task.needs.items()):
                continue
            if self._held(task):
                return True
            for p, (_, hi) in task.needs.items():
                free[p] -= min(hi, free[p])
        return False

    def restore(self, cp: Checkpoint) -> None:
        """Go back to checkpoint ``cp`` (taken by this kernel; used once): its state, and the
        tasks that had not started by then not started."""
        self.now, self._seq, self._heap, self.free, self.fired = cp.now, cp.seq, cp.heap, cp.free, cp.fired
        self.done, self._ready, self._blocked, self._missing = cp.done, cp.ready, cp.blocked, cp.missing
        self._unstarted = cp.unstarted
        for task in self._unstarted.values():
            task.start_s = task.end_s = math.nan
            task.granted = {}
            task.result = None
        self.checkpoint = None

    def _keep(self, saved: object) -> Checkpoint:
        return Checkpoint(self.now, self._seq, list(self._heap), dict(self.free), dict(self.fired), list(self.done),
                          list(self._ready), {e: list(ts) for e, ts in self._blocked.items()}, dict(self._missing),
                          dict(self._unstarted), saved)

    # ------------------------------------------------------------------ the loop
    def _try_start(self) -> None:
        if self._save is not None and self._would_start_held():
            self.checkpoint = self._keep(self._save())
            self._save = None
        waiting: list[tuple[tuple[int, ...], int, Task]] = []
        for entry in self._ready:
            task = entry[2]
            if self._held(task) or not all(self.free[p] >= lo for p, (lo, _) in task.needs.items()):
                waiting.append(entry)
                continue
            grant = {p: min(hi, self.free[p]) for p, (_, hi) in task.needs.items()}
            for p, g in grant.items():
                self.free[p] -= g
            task.granted = grant
            task.start_s = self.now
            run = task.run(self.now, dict(grant))
            assert run.duration_s >= 0 and math.isfinite(run.duration_s), (task.name, run.duration_s)
            task.result = run
            task.end_s = self.now + run.duration_s
            released: dict[str, int] = {}
            for off, pool, g in run.releases:
                assert 0 <= off <= run.duration_s + 1e-9
                released[pool] = released.get(pool, 0) + g
                self._push(self.now + off, _Release(pool, g))
            for pool, g in released.items():
                assert g <= grant.get(pool, 0), (task.name, pool, g, grant)
            for off, event in run.milestones:
                self._push(self.now + off, event)
            rest = {p: g - released.get(p, 0) for p, g in grant.items()}
            self._push(task.end_s, _Finish(task, rest))
            del self._unstarted[task.name]
        self._ready = waiting

    def run(self, until_s: float = math.inf) -> None:
        self._try_start()
        while self._heap:
            t, _, item = heapq.heappop(self._heap)
            if t > until_s:
                break
            self.now = t
            if isinstance(item, _Release):
                self.free[item.pool] += item.gpus
            elif isinstance(item, str):
                if item not in self.fired:
                    self.fired[item] = t
                    self._fire(item)
            else:
                for p, g in item.rest.items():
                    self.free[p] += g
                name = item.task.name
                first = name not in self.fired
                self.fired[name] = t
                if first:
                    self._fire(name)
                self.done.append(item.task)
            # Fire everything at the same instant before scheduling (determinism).
            if self._heap and self._heap[0][0] == t:
                continue
            self._try_start()
        stuck = sorted(name for name, task in self._unstarted.items() if not self._held(task))
        if stuck and until_s == math.inf:
            raise RuntimeError(f"simulation deadlocked; waiting: {', '.join(stuck[:5])}")

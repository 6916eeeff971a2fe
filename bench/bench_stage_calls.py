"""Benchmark (issue 17): the cost of the forward and training stage models, on the calls a real
question makes.

Runs one ``rlperf plan`` question in process (:func:`rlperf.api.plan`, ``--jobs 1``, no
timeline) and records every call of :func:`rlperf.stages.forward.forward_pass` and
:func:`rlperf.stages.train.train_step` it makes (after the stage memo of ``rlperf.sim.costs``:
each distinct batch and layout once), then replays them with every process-wide memo of the
stage models emptied first: CPU seconds of the replay (best of ``--repeat``,
``time.process_time``), and a digest of every field of every result (``StageCost``), so two
trees can be compared for identical results as well as for speed (run it in each with
``PYTHONPATH=<tree>/src``).

Run: .venv/bin/python bench/bench_stage_calls.py [--repeat 3] [plan options as in
bench/bench_plan_split.py, e.g. --model Qwen3-8B --nodes 4; none: the README's main job]
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import sys
import time
from collections.abc import Callable
from typing import Any

import rlperf.stages.forward as forward
import rlperf.stages.train as train
from bench_plan_split import question
from rlperf import api
from rlperf.memo import BoundedMemo
from rlperf.plan.search import local_mapper
from rlperf.stages.base import StageCost

Call = tuple[Callable[..., StageCost], tuple[Any, ...], dict[str, Any]]


def record(question: dict[str, Any]) -> list[Call]:
    """Every forward_pass and train_step call of one plan question, in order."""
    calls: list[Call] = []
    originals = (forward.forward_pass, train.train_step)

    def recorder(fn: Callable[..., StageCost]) -> Callable[..., StageCost]:
        def recording(*args: Any, **kwargs: Any) -> StageCost:
            calls.append((fn, args, kwargs))
            return fn(*args, **kwargs)
        return recording

    # rlperf.sim.costs imports them at each call
    forward.forward_pass, train.train_step = (recorder(fn) for fn in originals)
    try:
        api.plan(None, mapper=local_mapper(1), timeline=False, **question)
    finally:
        forward.forward_pass, train.train_step = originals
    return calls


def clear_memos() -> None:
    """Empty every process-wide memo (the replay pays each first-time cost again)."""
    for obj in gc.get_objects():
        if isinstance(obj, BoundedMemo):
            obj.clear()


def digest(results: list[StageCost]) -> str:
    h = hashlib.sha256()
    for r in results:
        for f in dataclasses.fields(r):
            h.update(repr(getattr(r, f.name)).encode())
    return h.hexdigest()[:16]


def main() -> None:
    argv = sys.argv[1:]
    repeat = int(argv.pop(argv.index("--repeat") + 1)) if "--repeat" in argv else 3
    if "--repeat" in argv:
        argv.remove("--repeat")
    calls = record(question(argv))
    n_fwd = sum(1 for fn, _, _ in calls if fn.__name__ == "forward_pass")
    times, results = [], []
    for _ in range(repeat):
        clear_memos()
        t0 = time.process_time()
        results = [fn(*args, **kwargs) for fn, args, kwargs in calls]
        times.append(time.process_time() - t0)
    print(f"{len(calls)} stage calls ({n_fwd} forward, {len(calls) - n_fwd} train): {min(times):.3f} CPU-s "
          f"(best of {repeat}), {1e3 * min(times) / max(len(calls), 1):.2f} ms per call; results digest {digest(results)}")


if __name__ == "__main__":
    main()

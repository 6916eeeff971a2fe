"""Benchmark (issue 17): the cost of one request-level rollout simulation, on the calls a real
question makes.

Runs one ``rlperf plan`` question in process (:func:`rlperf.api.plan`, ``--jobs 1``, no
timeline: the planner's own settings) and records every call of
:func:`rlperf.stages.rollout.simulate_rollout` it makes (inputs, and the step model
``rlperf.sim.costs`` passes), then replays them: CPU seconds of the replay (best of
``--repeat``, ``time.process_time``), per call, and a digest of every field of every result
(``RolloutResult``: arrays, figures and timeline), so two trees can be compared for identical
results as well as for speed (run it in each with ``PYTHONPATH=<tree>/src``).

Run: .venv/bin/python bench/bench_rollout_calls.py [--repeat 3] [plan options as in
bench/bench_plan_split.py, e.g. --model Qwen3-8B --nodes 4; none: the README's main job]
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from typing import Any

import numpy as np

import rlperf.stages.rollout as rollout
from rlperf import api
from rlperf.plan.search import local_mapper
from rlperf.stages.rollout_result import RolloutResult

Call = tuple[tuple[Any, ...], dict[str, Any]]


def record(question: dict[str, Any]) -> list[Call]:
    """Every simulate_rollout call of one plan question, in order."""
    calls: list[Call] = []
    simulate = rollout.simulate_rollout

    def recording(*args: Any, **kwargs: Any) -> RolloutResult:
        calls.append((args, kwargs))
        return simulate(*args, **kwargs)

    rollout.simulate_rollout = recording  # rlperf.sim.costs imports it at each call
    try:
        api.plan(None, mapper=local_mapper(1), timeline=False, **question)
    finally:
        rollout.simulate_rollout = simulate
    return calls


def digest(results: list[RolloutResult]) -> str:
    h = hashlib.sha256()
    for r in results:
        for f in dataclasses.fields(r):
            v = getattr(r, f.name)
            if f.name == "timeline":
                for log in v:
                    for column in (log.start_s, log.end_s, log.batch_size, log.prefill):
                        h.update(repr(column).encode())
            elif isinstance(v, np.ndarray):
                h.update(str(v.dtype).encode() + np.ascontiguousarray(v).tobytes())
            else:
                h.update(repr(v).encode())
    return h.hexdigest()[:16]


def main() -> None:
    argv = sys.argv[1:]
    repeat = 3
    if "--repeat" in argv:
        at = argv.index("--repeat")
        repeat = int(argv[at + 1])
        del argv[at : at + 2]
    question: dict[str, Any] = {}
    for name, value in zip(argv[::2], argv[1::2]):
        question[name.lstrip("-").replace("-", "_")] = int(value) if value.isdigit() else value
    calls = record(question)
    requests = sum(args[3].num_requests for args, _ in calls)
    best, results = float("inf"), []
    for _ in range(repeat):
        t0 = time.process_time()
        results = [rollout.simulate_rollout(*args, **kwargs) for args, kwargs in calls]
        best = min(best, time.process_time() - t0)
    print(f"{len(calls)} rollout calls, {requests:,} requests: {best:.2f} CPU-s (best of {repeat}), "
          f"{1e3 * best / max(len(calls), 1):.1f} ms per call; results digest {digest(results)}")


if __name__ == "__main__":
    main()

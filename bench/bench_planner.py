"""Benchmark (issue 5): how fast the planner's fast estimate ranks candidate plans, and how long
a full search for 1,024 GPUs takes.

The fast estimate composes memoized stage costs in closed form (rlperf.plan.estimate). The
first evaluation of a (stage, layout, GPUs) triple runs the stage cost model; later
candidates that share it only do arithmetic. Both rates are printed: "cold" counts every
stage-cost evaluation a fresh search pays, "warm" is the composition alone.

Run: .venv/bin/python bench/bench_planner.py [--skip-1024]
"""

from __future__ import annotations

import sys
import time

from rlperf.errors import SpecError
from rlperf.plan.estimate import Estimator
from rlperf.plan.search import local_mapper, search
from rlperf.plan.space import Candidate, SearchOptions, enumerate_candidates
from rlperf.scenario import load_scenario


def estimate_rate() -> None:
    sc = load_scenario("grpo-qwen2.5-7b-colocated-sync")
    cands = [c for c in enumerate_candidates(sc, SearchOptions()) if isinstance(c, Candidate)]
    est = Estimator(sc)
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        ok = 0
        for c in cands:
            try:
                est.estimate(c)
                ok += 1
            except SpecError:
                pass
        dt = time.perf_counter() - t0
        print(f"fast estimate ({label}): {len(cands)} candidates in {dt:.3f} s = {len(cands) / dt:,.0f} candidates/s "
              f"({ok} feasible, {est.evaluations} stage-cost evaluations in total)")


def search_1024() -> None:
    sc = load_scenario({
        "name": "bench-1024",
        "model": "Qwen2.5-32B",
        "cluster": {"gpu": "H100", "num_nodes": 128, "gpus_per_node": 8},
        "workload": {"preset": "dapo-qwen2.5-32b"},
        "algorithm": {"name": "GRPO", "minibatches": 16},
        "plan": {"rollout": {"tp": 4}, "layouts": {"actor": {"cp": 2, "cp_kind": "ulysses", "max_tokens_per_microbatch": 16384}}},
    })
    t0 = time.perf_counter()
    res = search(sc, SearchOptions(), local_mapper())
    dt = time.perf_counter() - t0
    print(f"full search, 1,024 H100 (GRPO Qwen2.5-32B, 512x16, 20k responses): {dt:.1f} s; "
          f"{res.considered} candidates, {len(res.rejected)} rejected; best: {res.best.label} on {res.best.num_gpus} GPUs, "
          f"{res.best.step_time_s:.0f} s per step")
    for n in res.notes:
        print("  " + n)


if __name__ == "__main__":
    estimate_rate()
    if "--skip-1024" not in sys.argv:
        search_1024()

"""Benchmark (issue 17): where one `rlperf plan` question's CPU seconds go, in process.

``rlperf.api.plan`` runs in phases that its progress callback names: the search (bounds, fast
estimates, simulations of the top plans), the what-ifs of the best plan, the step-time range
(the best plan at published runs' mean lengths, when the lengths are assumed), run totals and
a length sweep. This script times each phase in CPU seconds of this process
(``time.process_time`` at each change of phase; ``--jobs 1``: no worker processes) and lists
every simulation run after the search: its plan, mean response length, iterations simulated
(warm-up included) and CPU seconds. bench/bench_plan_questions.py measures the whole command
in a child process (imports included); this one says which part to look at.

Run: .venv/bin/python bench/bench_plan_split.py [plan options, e.g. --model Qwen3-8B --nodes 4]
(:func:`rlperf.api.plan`'s keyword options as ``--name value``, ``--lengths 1000,2000`` a list; none:
the README's main job)
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import rlperf.sim.run as sim_run
from rlperf import api
from rlperf.plan.search import local_mapper
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult


# The phases after the search, as api.plan's progress lines start, and their short names.
AFTER_SEARCH = (("what-ifs", "what-ifs"), ("step-time range", "range"), ("run totals", "run totals"),
                ("length sweep", "sweep"))


def question(argv: list[str]) -> dict[str, Any]:
    q: dict[str, Any] = {}
    for name, value in zip(argv[::2], argv[1::2]):
        key = name.lstrip("-").replace("-", "_")
        if key == "lengths":
            q[key] = [float(v) for v in value.split(",")]
        else:
            q[key] = int(value) if value.isdigit() else value
    return q


def main() -> None:
    phases: list[tuple[str, float]] = [("search", time.process_time())]
    sims: list[tuple[str, str, float, int, float]] = []  # phase, plan, mean tokens, iterations, CPU-s

    def progress(what: str, done: int, total: int) -> None:
        # The search reports many lines; every later phase is one line, named by its start.
        name = next((short for start, short in AFTER_SEARCH if what.startswith(start)), phases[-1][0])
        if name != phases[-1][0]:
            phases.append((name, time.process_time()))

    run_scenario: Callable[..., SimResult] = sim_run.run_scenario

    def counted(sc: Scenario, timeline: bool = True) -> SimResult:
        t0 = time.process_time()
        r = run_scenario(sc, timeline=timeline)
        p = sc.plan
        split = f" {p.placement.rollout_gpus}" if p.placement.rollout_gpus else ""
        label = f"{p.placement.kind}{split} gen tp{p.rollout.tp} {p.mode.kind}"
        sims.append((phases[-1][0], label, sc.workload.response_length.mean_tokens(), len(r.step_times_s),
                     time.process_time() - t0))
        return r

    sim_run.run_scenario = counted  # rlperf.plan.search imports it at each call
    gc.disable()  # as `rlperf plan` runs (rlperf.cli.app.collector_paused)
    ans = api.plan(None, mapper=local_mapper(1), timeline=False, progress=progress, **question(sys.argv[1:]))
    phases.append(("end", time.process_time()))
    print(f"best: {ans.best.label} on {ans.best.num_gpus} GPUs, {ans.best.step_time_s:.1f} s/step")
    for (name, t0), (_, t1) in pairwise(phases):
        n = sum(1 for s in sims if s[0] == name)
        print(f"{name}: {t1 - t0:.2f} CPU-s, {n} simulations")
    for phase, label, mean, iterations, cpu in sims:
        if phase != "search":
            print(f"  {phase}: {label}, mean {mean:,.0f} tokens, {iterations} iterations, {cpu:.2f} CPU-s")


if __name__ == "__main__":
    main()

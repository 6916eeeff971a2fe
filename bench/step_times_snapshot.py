"""Snapshot of the simulated step times of every shipped scenario and of the planner's
estimates on one of them, as JSON: run before and after a speed-up and diff the two files
(the speed-ups must not change a single number).

Run: .venv/bin/python bench/step_times_snapshot.py > after.json
"""

from __future__ import annotations

import json

from rlperf.errors import SpecError
from rlperf.plan.estimate import Estimator
from rlperf.plan.space import Candidate, SearchOptions, enumerate_candidates
from rlperf.scenario import list_scenarios, load_scenario
from rlperf.sim.run import run_scenario


def main() -> None:
    out: dict[str, object] = {}
    for name in list_scenarios():
        r = run_scenario(load_scenario(name))
        out[name] = {"step_times_s": list(r.step_times_s), "lower_bound_s": r.bounds.lower_bound_s}
    sc = load_scenario("grpo-qwen2.5-7b-colocated-sync")
    est = Estimator(sc)
    ests: dict[str, float | str] = {}
    for c in enumerate_candidates(sc, SearchOptions()):
        if isinstance(c, Candidate):
            try:
                ests[c.label] = est.estimate(c).step_time_s
            except SpecError as err:
                ests[c.label] = str(err)
    out["estimates"] = ests
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()

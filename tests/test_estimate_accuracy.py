"""The fast estimate against the simulator on random plans of random small scenarios: the
estimate only ranks plans for simulation, but a ranking off by 40% simulates the wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

from rlperf.errors import SpecError
from rlperf.plan.estimate import Estimator
from rlperf.plan.search import _simulate_one
from rlperf.plan.space import Candidate, SearchOptions, enumerate_candidates
from tests.test_planner_bound import random_scenario


@pytest.mark.slow
def test_fast_estimate_is_within_ten_percent_of_the_simulator_in_median() -> None:
    rng = np.random.default_rng(17)
    errors: list[float] = []
    by_mode: dict[str, list[float]] = {}
    seed = 100
    while len(errors) < 200:
        sc = random_scenario(seed)
        seed += 1
        est = Estimator(sc)
        cands = [c for c in enumerate_candidates(sc, SearchOptions()) if isinstance(c, Candidate)]
        for k in rng.choice(len(cands), size=min(10, len(cands)), replace=False).tolist():
            c = cands[int(k)]
            try:
                e = est.estimate(c).step_time_s
            except SpecError:
                continue
            r = _simulate_one((sc, c.plan))
            if isinstance(r, str):
                continue
            err = e / r.normalized_step_time_s - 1.0
            errors.append(err)
            by_mode.setdefault(c.label.rsplit(" | ", 1)[-1].split(" ")[0], []).append(err)
    med = float(np.median(np.abs(errors)))
    print(f"\nfast estimate vs simulator over {len(errors)} random plans: median |difference| {med:.1%}, "
          f"90th percentile {np.percentile(np.abs(errors), 90):.1%}")
    for mode, errs in sorted(by_mode.items()):
        print(f"  {mode}: n={len(errs)}, median difference {np.median(errs):+.1%}")
    assert med < 0.10

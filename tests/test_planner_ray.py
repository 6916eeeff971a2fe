"""`--executor ray`: the same sweep on a (local) Ray instance gives the same plans."""

from __future__ import annotations

import pytest

from rlperf.plan.search import local_mapper, ray_mapper, search
from rlperf.plan.space import SearchOptions
from tests.test_planner import small_scenario


def test_ray_executor_matches_the_local_one() -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        sc = small_scenario(2)
        a = search(sc, SearchOptions(top_k=1), ray_mapper())
        b = search(sc, SearchOptions(top_k=1), local_mapper(1))
    finally:
        ray.shutdown()
    assert a.best.label == b.best.label and a.best.num_gpus == b.best.num_gpus
    assert a.best.step_time_s == b.best.step_time_s
    assert [e.label for e in a.evaluated] == [e.label for e in b.evaluated]

"""The work-depth analysis of a scenario: bounds are consistent and respected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.stages.base import StageCost
from rlperf.workdepth import STAGES, STRATEGIES, analyze
from tests.test_scenarios import small


def test_symbolic_tables_cover_the_taxonomy() -> None:
    whats = " ".join(r.what for r in STAGES + STRATEGIES)
    for word in ("decode", "prefill", "training", "weight sync", "data parallel", "tensor", "pipeline", "context",
                 "expert", "colocation", "disaggregation", "async", "partial rollout", "fusion"):
        assert word in whats


@pytest.mark.parametrize("name", ["grpo-qwen2.5-7b-colocated-sync", "ppo-qwen2.5-7b-hybrid"])
def test_every_stage_respects_its_lower_bound(name: str) -> None:
    rep = analyze(small(name))
    for s in rep.stages:
        assert s.lower_bound_s <= s.brent_bound_s
        if s.pool != "cpu":
            assert s.predicted_s >= s.lower_bound_s * (1 - 1e-9), s
    assert rep.step_predicted_s >= rep.step_lower_bound_s * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(work=st.floats(0, 1e6), depth=st.floats(0, 1e4), p=st.integers(1, 4096), more=st.integers(1, 4096))
def test_more_devices_never_raise_the_lower_bound(work: float, depth: float, p: int, more: int) -> None:
    c = StageCost("x", time_s=work + depth, num_gpus=p, work_s=work, depth_s=depth)
    assert c.lower_bound_s(p + more) <= c.lower_bound_s(p)
    assert c.lower_bound_s(p) <= c.brent_bound_s(p)


def test_doubling_response_lengths_at_least_doubles_decode_depth() -> None:
    import numpy as np

    from rlperf.sim.costs import AnalyticCosts
    from rlperf.sim.interface import RolloutBatch

    sc = small("grpo-qwen2.5-7b-colocated-sync")
    c = AnalyticCosts(sc)
    r = np.array([100, 700, 1500, 3000], dtype=np.int64)
    def depth(resp: np.ndarray) -> float:
        b = RolloutBatch(np.full(4, 64, np.int64), resp, np.zeros(4, np.int64), np.arange(4, dtype=np.int64))
        return dict(c.rollout(b, 8, None).cost.breakdown)["decode_depth"]
    assert depth(2 * r) >= 2 * depth(r) * (1 - 1e-9)

"""What-ifs of the best plan: a variant above the search's staleness limit says so."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlperf.api import build_scenario, simulate
from rlperf.plan.explain import explain
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult
from rlperf.specs.plan import Plan


def test_a_what_if_above_the_staleness_limit_is_marked_not_a_candidate() -> None:
    sc = build_scenario(None, model="Qwen2.5-0.5B", nodes=1, gpus_per_node=2)[0]  # type: ignore[arg-type]
    base = simulate(sc, iterations=2)
    lagging = dataclasses.replace(base, staleness=(0, 1, 3, 3))

    def fake(pairs: Sequence[tuple[Scenario, Plan]]) -> list[SimResult | str]:
        return [lagging for _ in pairs]

    notes = {m: {w.note for w in explain(sc, base, fake, m).what_ifs} for m in (None, 2, 3)}
    assert notes[2] == {"lags 3 versions, above the staleness limit 2: not a candidate"}
    assert notes[3] == notes[None] == {""}

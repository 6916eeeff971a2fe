"""Scenario fields that took no effect are refused at load with one line naming the field (or,
where the combination is a legitimate degenerate case, flagged): the fuzzing pass's findings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import invoke
from tests.test_hardening_corpus import simulate_refused, small, write

SPLIT = {"kind": "disaggregated", "rollout_gpus": 4}


@pytest.mark.parametrize("changes, contains", [
    ({"plan.mode": {"kind": "sync", "staleness": 3}}, "plan.mode.staleness: 3 is not used by mode kind 'sync'; allowed: only with kind one_step_off, async, partial_rollout"),
    ({"plan.mode": {"kind": "sync", "token_budget": 100}}, "plan.mode.token_budget: 100 is not used by mode kind 'sync'; allowed: only with kind partial_rollout"),
    ({"plan.mode": {"kind": "async", "staleness": 1, "train_parts": 2}}, "plan.mode.train_parts: 2 is not used by mode kind 'async'"),
    ({"plan.mode": {"kind": "partial_rollout", "token_budget": 300, "fusion": True}}, "plan.mode.fusion: true is not used by mode kind 'partial_rollout'"),
    ({"plan.mode": {"kind": "sync", "inflight_weight_updates": True}}, "plan.mode.inflight_weight_updates: true is not used by mode kind 'sync'"),
    ({"plan.mode": {"kind": "sync", "fusion_chunks": 8}}, "plan.mode.fusion_chunks: 8 waves without fusion: true"),
    ({"plan.mode": {"kind": "one_step_off", "staleness_threshold": 0.5}}, "plan.mode.staleness_threshold: 0.5 is not used by mode kind 'one_step_off'; allowed: only with kind streaming"),
    ({"plan.placement": {"kind": "colocated", "rollout_gpus": 2}}, "plan.placement.rollout_gpus: set, but placement kind 'colocated' does not use it; allowed: only with kind disaggregated"),
    ({"plan.placement": {**SPLIT, "assign": {"generate": "x"}}}, "plan.placement.assign: set, but placement kind 'disaggregated' does not use it; allowed: only with kind hybrid"),
    ({"algorithm.critic_model": "Qwen2.5-0.5B"}, "algorithm.critic_model: GRPO has no critic; allowed: only with an algorithm that trains one (PPO, VAPO)"),
    ({"plan.layouts": {"actor": {}, "critic": {"tp": 2}}}, "plan.layouts.critic: GRPO has no critic"),
    ({"plan.layouts": {"actor": {"dp": 7}}}, "plan.layouts.actor.dp: 7 differs from the dp derived from its pool: 8 GPUs // tp·pp·cp 1 = 8; allowed: 8, or leave dp out"),
    ({"plan.mode": {"kind": "partial_rollout", "token_budget": 1}}, "plan.mode.token_budget: 1 tokens per call: 0 of the first step's 64 responses are that short"),
])
def test_a_field_that_would_be_ignored_is_refused(tmp_path: Path, changes: dict[str, Any], contains: str) -> None:
    simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**changes)), contains=contains)


def test_a_dp_equal_to_the_derived_one_is_accepted(tmp_path: Path) -> None:
    sc = write(tmp_path / "sc.yaml", small(**{"plan.layouts": {"actor": {"tp": 2, "dp": 2}}, "plan.placement": SPLIT}))
    res = invoke(["simulate", str(sc), "--out", str(tmp_path / "out")], time_limit_s=30)
    assert res.code == 0, res.err


def test_the_smallest_token_budget_named_in_the_error_runs(tmp_path: Path) -> None:
    line = simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**{"plan.mode": {"kind": "partial_rollout", "token_budget": 1}})))
    least = int(line.split("allowed: >= ")[1].split(" ")[0].replace(",", ""))
    ok = write(tmp_path / "ok.yaml", small(**{"plan.mode": {"kind": "partial_rollout", "token_budget": least}}))
    res = invoke(["simulate", str(ok), "--out", str(tmp_path / "out2")], time_limit_s=30)
    assert res.code == 0, res.err


@pytest.mark.parametrize("offload, warned", [(True, True), (False, False)])
def test_one_step_off_on_a_sleeping_shared_engine_says_it_runs_synchronously(tmp_path: Path, offload: bool, warned: bool) -> None:
    sc = write(tmp_path / "sc.yaml", small(**{"plan.mode": {"kind": "one_step_off"}, "plan.offload_between_phases": offload}))
    res = invoke(["simulate", str(sc), "--out", str(tmp_path / "out")], time_limit_s=30)
    assert res.code == 0, res.err
    note = "one-step-off on a colocated placement runs synchronously: rollout and training share the GPUs"
    assert (note in res.err + res.out) is warned
    # The result says it too, beside its label, and the answer names the model and the cluster.
    assert ("one-step-off runs synchronously here (staleness 0)" in res.out) is warned
    assert res.out.splitlines()[0].startswith("GRPO on Qwen2.5-"), res.out.splitlines()[0]


def test_a_micro_batch_token_budget_below_1024_is_labelled_as_written() -> None:
    from rlperf.plan.space import layout_label
    from rlperf.specs.parallel import TrainLayout

    assert "mb10 " in layout_label(TrainLayout(max_tokens_per_microbatch=10)) + " "
    assert "mb16k" in layout_label(TrainLayout(max_tokens_per_microbatch=16384))

"""The plan's memory table (rlperf.plan.memory_breakdown): each pass sized at its own
micro-batching, at the worst micro-batch (every sequence at the length cap) and at a micro-batch
of mean-length sequences, each checked against the closed forms of rlperf.cost.memory."""

from __future__ import annotations

import pytest

from rlperf.cost.memory import forward_memory, train_memory
from rlperf.plan.memory_breakdown import RoleMemory, concrete_plan, memory_breakdown
from rlperf.scenario import Scenario, load_scenario_spec, resolve
from rlperf.specs.parallel import TrainLayout

SPEC = load_scenario_spec("grpo-qwen2.5-7b-colocated-sync")  # Qwen2.5-7B, 64 GPUs, 512 x 16, caps 1,024 + 8,192


def _scenario(actor: TrainLayout, workload: dict[str, object] | None = None) -> Scenario:
    plan = SPEC.plan.model_copy(update={"layouts": {"actor": actor}})
    return resolve(SPEC.model_copy(update={"plan": plan, "workload": workload or SPEC.workload}))


def _row(sc: Scenario, role: str, work: str) -> RoleMemory:
    return next(r for r in memory_breakdown(sc, sc.plan, sc.cluster.num_gpus) if (r.role, r.work) == (role, work))


def _mean(sc: Scenario) -> int:
    return round(sc.workload.prompt_length.mean_tokens() + sc.workload.response_length.mean_tokens())


def test_fixed_micro_batches_worst_at_the_cap_and_mean_at_the_mean_length() -> None:
    sc = _scenario(TrainLayout(micro_batch_size=2, recompute="full"))
    longest, mean = sc.workload.max_sequence_tokens, _mean(sc)
    row = _row(sc, "actor", "train")
    assert (row.micro_batch_tokens, row.mean_micro_batch_tokens) == (2 * longest, 2 * mean)
    lay = concrete_plan(sc.plan, sc.cluster.num_gpus).layout_for("actor")
    worst = train_memory(sc.models["actor"], lay, 2 * longest, seq_len=longest)
    typical = train_memory(sc.models["actor"], lay, 2 * mean, seq_len=mean)
    assert row.device_bytes == pytest.approx(worst.total_bytes)
    assert row.mean_device_bytes == pytest.approx(typical.total_bytes)
    assert row.mean_device_bytes < row.device_bytes


def test_forward_passes_use_their_own_micro_batching() -> None:
    # verl's rollout.log_prob_micro_batch_size_per_gpu: the old-policy log-probs cut 8 sequences
    # while training cuts 1; the table sized them at the training micro-batch
    sc = _scenario(TrainLayout(micro_batch_size=1, forward_micro_batch_size=8))
    longest = sc.workload.max_sequence_tokens
    old = _row(sc, "actor", "forward")
    assert old.micro_batch_tokens == 8 * longest
    lay = concrete_plan(sc.plan, sc.cluster.num_gpus).layout_for("actor").for_forward_passes()
    assert old.logits_bytes == pytest.approx(forward_memory(sc.models["actor"], lay, 8 * longest, seq_len=longest).logits_bytes)
    assert _row(sc, "actor", "train").micro_batch_tokens == longest


def test_a_token_budget_holds_budget_x_cp_tokens_over_its_cp_group() -> None:
    sc = _scenario(TrainLayout(cp=2, cp_kind="ulysses", max_tokens_per_microbatch=16384))
    row = _row(sc, "actor", "train")
    mean = _mean(sc)
    assert row.micro_batch_tokens == 2 * 16384  # the budget is per device, as verl's *_max_token_len_per_gpu
    assert row.mean_micro_batch_tokens == (2 * 16384 // mean) * mean  # as many mean-length sequences as it holds


def test_the_joint_length_cap_bounds_the_worst_case() -> None:
    workload = {**SPEC.workload, "max_total_tokens": 4096}
    sc = _scenario(TrainLayout(micro_batch_size=1), workload)
    assert _row(sc, "actor", "train").micro_batch_tokens == 4096  # not prompt cap + response cap (9,216)

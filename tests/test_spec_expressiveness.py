"""What the specs can say: old log-probs kept at one update, experts folded over tensor ranks
(EP x ETP), FP8 training, forward-pass micro-batches, a joint prompt + response cap, and a
GB200 NVL72 rack as one 72-GPU NVLink domain."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rlperf.catalog import load_model
from rlperf.cost.collectives import group_for
from rlperf.cost.memory import train_memory
from rlperf.errors import SpecError
from rlperf.scenario import ClusterSpec, ScenarioSpec, resolve
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.lengths import FixedLength, LogNormalLength
from rlperf.specs.parallel import TrainLayout, check_train_layout
from rlperf.specs.workload import Workload, workload_from_dict
from rlperf.stages.elementwise import FUSED
from rlperf.stages.forward import forward_pass
from rlperf.stages.shard import stage_shards
from rlperf.stages.train import train_step

MOE = load_model("Qwen3-30B-A3B")  # 128 experts, top-8
DENSE = load_model("Qwen2.5-7B")
NODE = make_cluster("h100_sxm", num_gpus=8)
SEQS = np.full(16, 2048)


# ------------------------------------------------------------------ old-policy log-probs
def _stage_names(old_logprob: str) -> list[str]:
    spec = ScenarioSpec.model_validate({
        "model": "Qwen3-0.6B", "algorithm": {"name": "GRPO", "old_logprob": old_logprob, "epochs": 1, "minibatches": 1},
    })
    sc = resolve(spec)
    return [s.name for s in sc.algorithm.active_stages(sc.epochs * sc.minibatches)]


def test_old_logprob_pass_can_be_kept_at_one_update_per_step() -> None:
    assert "old_logprob" not in _stage_names("when_needed")
    names = _stage_names("always")
    assert "old_logprob" in names
    assert names.index("old_logprob") < names.index("actor_update")


def test_old_logprob_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="old_logprob"):
        ScenarioSpec.model_validate({"algorithm": {"old_logprob": "sometimes"}})


# ------------------------------------------------------------------ EP x ETP
def test_experts_folded_over_tensor_ranks_hold_the_same_expert_share() -> None:
    classic = TrainLayout(tp=4, ep=2, dp=2)  # etp = tp: 8 expert shards
    folded = TrainLayout(tp=4, ep=8, etp=1, dp=2)  # ep over the tp ranks: 8 expert shards
    assert classic.expert_shards == folded.expert_shards == 8
    a = stage_shards(MOE, 4, 1, 2)
    b = stage_shards(MOE, 4, 1, 8, etp=1)
    assert a[0].expert_params == pytest.approx(b[0].expert_params)
    # the same FLOPs per token, in wider expert GEMMs over fewer rows
    assert a[0].matmul_params_per_token == pytest.approx(b[0].matmul_params_per_token)
    flops_a = sum(w * r * c for w, r, c in zip(a[0].gemm_weights, a[0].gemm_rows_per_token, a[0].gemm_counts, strict=True))
    flops_b = sum(w * r * c for w, r, c in zip(b[0].gemm_weights, b[0].gemm_rows_per_token, b[0].gemm_counts, strict=True))
    assert flops_a == pytest.approx(flops_b)
    # as one grouped GEMM: E/ep experts x I/etp, the same GEMM
    grouped = replace(FUSED, expert_gemm_streams=None)
    ga, gb = stage_shards(MOE, 4, 1, 2, ops=grouped), stage_shards(MOE, 4, 1, 8, etp=1, ops=grouped)
    assert sorted(ga[0].gemm_weights) == sorted(gb[0].gemm_weights)
    # one GEMM per local expert (Megatron's TE GroupedLinear, 4 at once): 64 experts of I/4 in 16
    # waves of 4, or 16 whole experts in 4 waves of 4: each wave 4x wider when folded
    assert MOE.moe is not None
    d, i = MOE.hidden_size, MOE.moe.expert_intermediate_size
    assert 4 * d * i / 4 in a[0].gemm_weights and 4 * d * i in b[0].gemm_weights


def test_ep_beyond_dp_times_cp_needs_etp_below_tp() -> None:
    check_train_layout(MOE, TrainLayout(tp=4, ep=8, etp=1, dp=2))  # 8 | dp·cp·tp = 8
    with pytest.raises(SpecError, match="ep·etp"):
        check_train_layout(MOE, TrainLayout(tp=4, ep=8, dp=2))  # 8·4 does not divide 8
    with pytest.raises(ValueError, match="etp needs ep"):
        TrainLayout(tp=4, etp=2)


def test_folded_experts_shard_their_states_over_expert_data_parallel_ranks() -> None:
    lay = TrainLayout(tp=4, ep=8, etp=1, dp=2, zero_stage=1)
    assert lay.expert_shard_degree == 1
    dense = TrainLayout(tp=4, ep=2, dp=2, zero_stage=1)
    assert dense.expert_shard_degree == 1
    a = train_memory(MOE, lay, 4096)
    b = train_memory(MOE, dense, 4096)
    assert a.optimizer_bytes == pytest.approx(b.optimizer_bytes)


def test_folded_experts_run_through_a_training_step() -> None:
    cost = train_step(MOE, NODE, TrainLayout(tp=4, ep=8, etp=1, dp=2, max_tokens_per_microbatch=8192), SEQS)
    assert cost.time_s > 0 and cost.component("ep_comm") > 0


# ------------------------------------------------------------------ FP8 training
def test_fp8_training_runs_gemms_at_the_fp8_rate_and_caches_fp8_weights() -> None:
    bf16 = TrainLayout(tp=4, dp=2, max_tokens_per_microbatch=8192, zero_stage=1)
    fp8 = bf16.model_copy(update={"compute_dtype": "fp8"})
    a = train_step(DENSE, NODE, bf16, SEQS)
    b = train_step(DENSE, NODE, fp8, SEQS)
    peak_ratio = NODE.accelerator.peak("fp8") / NODE.accelerator.peak("bf16")
    # GEMMs speed up by at most the peak ratio; attention and elementwise work do not speed up
    assert a.component("compute") / peak_ratio <= b.component("compute") < a.component("compute")
    wa = train_memory(DENSE, bf16, 8192).weights_bytes
    wb = train_memory(DENSE, fp8, 8192).weights_bytes
    assert wb == pytest.approx(wa * 1.5)  # bf16 weights + one fp8 copy


def test_fp8_training_on_an_accelerator_without_fp8_is_named() -> None:
    spec = ScenarioSpec.model_validate({
        "model": "Qwen3-0.6B", "cluster": {"gpu": "A100"}, "workload": {"preset": "deepscaler-8k", "prompts_per_step": 8},
        "plan": {"layouts": {"actor": {"compute_dtype": "fp8"}}},
    })
    from rlperf.sim.costs import AnalyticCosts

    costs = AnalyticCosts(resolve(spec))
    with pytest.raises(SpecError, match="compute_dtype"):
        costs.forward("actor", SEQS, 8, "old_logprob")


# ------------------------------------------------------------------ forward micro-batches
def test_forward_passes_use_their_own_micro_batch_budget() -> None:
    train = TrainLayout(tp=4, dp=2, max_tokens_per_microbatch=4096, forward_max_tokens_per_microbatch=16384)
    same = TrainLayout(tp=4, dp=2, max_tokens_per_microbatch=16384)
    assert forward_pass(DENSE, NODE, train, SEQS).time_s == forward_pass(DENSE, NODE, same, SEQS).time_s
    assert forward_pass(DENSE, NODE, train.model_copy(update={"forward_max_tokens_per_microbatch": None}), SEQS).time_s != (
        forward_pass(DENSE, NODE, same, SEQS).time_s
    )
    assert train.for_forward_passes().micro_batch_size == 1
    counted = TrainLayout(micro_batch_size=2, forward_micro_batch_size=8).for_forward_passes()
    assert counted.micro_batch_size == 8


# ------------------------------------------------------------------ prompt + response cap
def test_joint_cap_bounds_every_sequence() -> None:
    w = Workload(
        prompts_per_step=64, group_size=4,
        prompt_length=LogNormalLength(median_tokens=900, sigma=0.6, cap_tokens=2048),
        response_length=FixedLength(tokens=4096), max_total_tokens=4608,
    )
    s = w.sample(0)
    total = s.prompt_tokens[:, None] + s.response_tokens
    assert total.max() <= 4608
    assert (s.response_tokens < 4096).any()  # long prompts cut their responses
    short = s.prompt_tokens <= 512
    assert (s.response_tokens[short] == 4096).all()  # short prompts keep the response cap
    assert w.max_sequence_tokens == 4608


def test_joint_cap_must_leave_room_after_the_prompt_cap() -> None:
    with pytest.raises(SpecError, match="max_total_tokens"):
        workload_from_dict({
            "prompts_per_step": 1, "group_size": 1, "prompt_length": {"kind": "fixed", "tokens": 1024},
            "response_length": {"kind": "fixed", "tokens": 8}, "max_total_tokens": 1024,
        })


# ------------------------------------------------------------------ GB200 NVL72
def test_gb200_job_packs_72_gpu_nvlink_domains() -> None:
    c = make_cluster("gb200", num_gpus=128)
    assert (c.num_nodes, c.gpus_per_node, c.last_node_gpus, c.num_gpus) == (2, 72, 56, 128)
    assert group_for(c, 72).num_nodes == 1  # one rack: all NVLink
    g = group_for(c, 128)
    assert (g.ranks_per_node, g.num_nodes) == (72, 2)
    assert c.with_gpus(72).num_gpus == 72 and c.with_gpus(72).num_nodes == 1
    assert c.with_gpus(100).last_node_gpus == 28


def test_scenario_cluster_by_gpu_count() -> None:
    sc = resolve(ScenarioSpec(model="Qwen3-0.6B", cluster=ClusterSpec(gpu="GB200", num_gpus=144)))
    assert (sc.cluster.num_nodes, sc.cluster.num_gpus) == (2, 144)
    with pytest.raises(SpecError, match="num_gpus"):
        resolve(ScenarioSpec(model="Qwen3-0.6B", cluster=ClusterSpec(gpu="GB200", num_gpus=144, num_nodes=3)))


def test_planner_resizes_a_partial_domain_cluster_by_gpu_count() -> None:
    from rlperf.plan.search import resized

    sc = resolve(ScenarioSpec(model="Qwen3-0.6B", cluster=ClusterSpec(gpu="GB200", num_gpus=128)))
    for gpus in (64, 72, 100):
        assert resized(sc, gpus).cluster.num_gpus == gpus

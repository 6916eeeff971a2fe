"""Training step: pipeline bubbles, data-parallel scaling and traffic, memory, work-depth bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_config, load_model
from rlperf.cost.collectives import all_gather, all_reduce, group_for
from rlperf.cost.memory import train_memory
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.pipeline import pipeline_time
from rlperf.stages.train import cpu_adam_params_per_s_for, train_step

SMALL = load_model("Qwen3-0.6B")  # 28 layers, 16 heads, 8 KV heads
DENSE = load_model("Qwen2.5-7B")
MOE = load_model("Qwen3-30B-A3B")
NODE = make_cluster("h100_sxm", num_gpus=8)
TWO_NODES = make_cluster("h100_sxm", num_gpus=16)
# every GEMM at the large-GEMM rate (no size curve): stages of equal layers cost exactly the same
FLAT = NODE.model_copy(update={"profile": NODE.profile.model_copy(update={"matmul_half_rate_flops": 0.0})})


def _bubble_fraction(cost) -> float:  # type: ignore[no-untyped-def]
    return cost.component("bubble") / cost.time_s


# ---------------------------------------------------------------------- pipeline schedules


@pytest.mark.parametrize("p,m", [(2, 1), (4, 4), (4, 8), (8, 3)])
def test_uniform_pipeline_bubble_is_closed_form(p: int, m: int) -> None:
    one_f_one_b = pipeline_time(np.full((p, m), 0.25))
    assert one_f_one_b.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert one_f_one_b.total_s == pytest.approx((m + p - 1) * 0.25)
    inter = pipeline_time(np.full((p, m * p), 0.25), "interleaved", 2)
    assert inter.bubble_fraction == pytest.approx((p - 1) / (2 * m * p + p - 1), rel=1e-12)


def test_pipeline_never_beats_one_microbatch_through_all_stages() -> None:
    t = pipeline_time(np.full((4, 1), 1.0), "interleaved", 4)
    assert t.total_s == pytest.approx(4.0)


def test_train_step_1f1b_bubble_fraction() -> None:
    # Uniform micro-batches; the value head keeps the last stage's extra work to d params.
    seqs = np.full(16, 2048)
    lay = TrainLayout(pp=4, zero_stage=1, micro_batch_size=2, recompute="full")
    cost = train_step(SMALL, FLAT, lay, seqs, head="value")
    m, p = 8, 4
    pipe = sum(cost.component(k) for k in ("compute", "pp_comm", "bubble"))
    assert cost.component("bubble") / pipe == pytest.approx((p - 1) / (m + p - 1), rel=2e-3)


def test_interleaved_bubble_is_smaller() -> None:
    seqs = np.full(16, 2048)
    plain = train_step(SMALL, NODE, TrainLayout(pp=4, zero_stage=1, micro_batch_size=4), seqs)
    inter = train_step(
        SMALL, NODE,
        TrainLayout(pp=4, zero_stage=1, micro_batch_size=4, pp_schedule="interleaved", virtual_stages=7), seqs,
    )
    assert inter.component("bubble") < plain.component("bubble") / 5
    assert inter.component("pp_comm") == pytest.approx(7 * plain.component("pp_comm"), rel=1e-6)
    assert inter.time_s < plain.time_s


# ---------------------------------------------------------------------- data parallelism


def test_doubling_dp_halves_compute_and_adds_traffic() -> None:
    seqs = np.random.default_rng(1).integers(1000, 6000, size=256)
    lay = TrainLayout(dp=8, zero_stage=3, max_tokens_per_microbatch=16384)
    one = train_step(DENSE, TWO_NODES, lay, seqs, num_minibatches=2)
    two = train_step(DENSE, TWO_NODES, lay.model_copy(update={"dp": 16}), seqs, num_minibatches=2)
    assert two.component("compute") / one.component("compute") == pytest.approx(0.5, rel=0.05)
    assert 0.45 < two.time_s / one.time_s < 0.6
    assert two.comm_bytes > one.comm_bytes
    assert two.work_s == pytest.approx(one.work_s, rel=0.02)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_dp_traffic_per_rank_is_the_zero_closed_form(zero: int) -> None:
    # dp=8 on one node, one micro-batch per rank, one step: only data-parallel traffic.
    n = 8
    lay = TrainLayout(dp=n, zero_stage=zero, micro_batch_size=4, grad_dtype="fp32", param_dtype="bf16")
    cost = train_step(SMALL, NODE, lay, np.full(4 * n, 512))
    psi, bp, bg = SMALL.num_params, bytes_per("bf16"), bytes_per("fp32")
    share = (n - 1) / n * psi
    expected = {
        # all-reduce: 2 share bg on a ring; NCCL picks NVLS inside an H100 node (bg x psi)
        0: all_reduce(NODE, psi * bg, group_for(NODE, n)).bytes_sent_per_rank,
        2: share * (bg + bp),  # reduce-scatter + all-gather of the updated weights
        3: share * (2 * bp + bg),  # all-gather forward and backward, reduce-scatter
    }[zero]
    assert cost.comm_bytes / n == pytest.approx(expected, rel=1e-9)


def test_zero2_equal_dtypes_is_twice_the_share() -> None:
    n = 8
    lay = TrainLayout(dp=n, zero_stage=2, micro_batch_size=4, grad_dtype="bf16", param_dtype="bf16")
    cost = train_step(SMALL, NODE, lay, np.full(4 * n, 512))
    assert cost.comm_bytes / n == pytest.approx(2 * (n - 1) / n * SMALL.num_params * 2, rel=1e-9)


def test_overlap_hides_gradient_reduction() -> None:
    seqs = np.full(64, 4096)
    on = train_step(DENSE, NODE, TrainLayout(dp=8, zero_stage=2, micro_batch_size=2), seqs)
    off = train_step(DENSE, NODE, TrainLayout(dp=8, zero_stage=2, micro_batch_size=2, overlap_grad_comm=False), seqs)
    assert on.component("grad_comm") < off.component("grad_comm")
    assert off.time_s - on.time_s == pytest.approx(off.component("grad_comm") - on.component("grad_comm"))


def test_gathers_without_prefetch_are_exposed_whole() -> None:
    """Without prefetch every ZeRO-3 gather waits: each micro-batch's forward and backward add
    the stage's whole all-gather (the same bytes as with prefetch, which hides all but one
    unit's gather behind the compute)."""
    n, seqs = 8, np.full(64, 2048)
    on = train_step(DENSE, NODE, TrainLayout(dp=n, zero_stage=3, micro_batch_size=4), seqs)
    off = train_step(DENSE, NODE, TrainLayout(dp=n, zero_stage=3, micro_batch_size=4, prefetch_gathers=False), seqs)
    gather = sum(c.time_s for c in [all_gather(NODE, DENSE.num_params * 2 / (DENSE.num_layers + 1), group_for(NODE, n))]
                 * (DENSE.num_layers + 1))
    micro_batches = 64 // n // 4
    assert off.component("zero_gather") == pytest.approx(2 * micro_batches * gather, rel=1e-9)
    assert on.component("zero_gather") < off.component("zero_gather")
    assert on.comm_bytes == pytest.approx(off.comm_bytes)


# ---------------------------------------------------------------------- FLOPs, steps, memory


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_flops_match_model_train_flops(recompute: str) -> None:
    seqs = np.array([700, 1500, 3000, 257])
    cost = train_step(SMALL, NODE, TrainLayout(dp=2, recompute=recompute, micro_batch_size=1), seqs)
    expected = sum(SMALL.train_flops(int(s), recompute) for s in seqs)  # type: ignore[arg-type]
    assert cost.flops == pytest.approx(expected, rel=0.01)  # + the log-softmax's elementwise FLOPs
    assert cost.flops >= expected


def test_steps_are_sequential() -> None:
    seqs = np.full(32, 1024)
    lay = TrainLayout(dp=4, micro_batch_size=2)
    one = train_step(SMALL, NODE, lay, seqs, num_minibatches=2, epochs=1)
    two = train_step(SMALL, NODE, lay, seqs, num_minibatches=2, epochs=2)
    assert two.time_s == pytest.approx(2 * one.time_s)
    assert two.depth_s == pytest.approx(2 * one.depth_s)
    assert two.work_s == pytest.approx(2 * one.work_s)


def test_peak_memory_comes_from_the_memory_model_and_overflow_is_an_error() -> None:
    seqs = np.full(16, 4096)
    lay = TrainLayout(dp=8, zero_stage=3, micro_batch_size=2)
    cost = train_step(DENSE, NODE, lay, seqs)
    assert cost.peak_memory_bytes == train_memory(DENSE, lay, 8192, seq_len=4096, num_microbatches=1).total_bytes
    with pytest.raises(SpecError, match=r"actor_update.*device memory"):
        train_step(DENSE, NODE, TrainLayout(dp=8, zero_stage=0, micro_batch_size=2), seqs)


def test_cpu_offloaded_optimizer_uses_the_given_rate() -> None:
    seqs = np.full(16, 1024)
    lay = TrainLayout(dp=8, zero_stage=3, offload_optimizer=True, micro_batch_size=2)
    with pytest.raises(SpecError, match="cpu_adam_params_per_s"):
        train_step(SMALL, NODE, lay, seqs, cpu_adam_params_per_s=0.0)
    rate = 1e9
    cost = train_step(SMALL, NODE, lay, seqs, cpu_adam_params_per_s=rate)
    local = SMALL.num_params / 8
    upload = local * 2 / NODE.accelerator.pcie_bandwidth_bytes_per_s
    assert cost.component("optimizer") == pytest.approx(local / rate + upload, rel=1e-9)


def test_cpu_offloaded_optimizer_runs_at_the_hosts_memory_bandwidth() -> None:
    """Without a given rate, CPU Adam streams 30 B per parameter (fp32 master, m, v read and
    written, fp32 gradient read, bf16 weight written) at the GPU's share of host DRAM bandwidth
    times host_adam_efficiency, when the rank's optimizer threads can stream that much."""
    seqs = np.full(16, 1024)
    lay = TrainLayout(dp=8, zero_stage=3, offload_optimizer=True, micro_batch_size=2, cpu_optimizer_threads=64)
    prof = NODE.profile
    rate = prof.host_memory_bandwidth_bytes_per_s * prof.host_adam_efficiency / 30.0
    assert 64 * prof.host_adam_thread_params_per_s > rate
    assert cpu_adam_params_per_s_for(NODE, lay) == pytest.approx(rate, rel=1e-12)
    cost = train_step(SMALL, NODE, lay, seqs)
    local = SMALL.num_params / 8
    upload = local * 2 / NODE.accelerator.pcie_bandwidth_bytes_per_s
    assert cost.component("optimizer") == pytest.approx(local / rate + upload, rel=1e-9)
    # twice the host bandwidth halves the host's part, not the upload
    fast = NODE.model_copy(update={"profile": prof.model_copy(
        update={"host_memory_bandwidth_bytes_per_s": 2 * prof.host_memory_bandwidth_bytes_per_s})})
    assert train_step(SMALL, fast, lay, seqs).component("optimizer") == pytest.approx(local / rate / 2 + upload, rel=1e-9)


def test_cpu_offloaded_optimizer_on_one_thread_runs_at_one_threads_rate() -> None:
    """A rank started with OMP_NUM_THREADS=1 (Ray's and torchrun's default, the layout's default)
    updates host_adam_thread_params_per_s parameters a second, below its DRAM share; k threads
    k times that, up to the share; no per-thread figure: the share."""
    seqs = np.full(16, 1024)
    prof = NODE.profile
    share = prof.host_memory_bandwidth_bytes_per_s * prof.host_adam_efficiency / 30.0
    one = TrainLayout(dp=8, zero_stage=3, offload_optimizer=True, micro_batch_size=2)
    assert one.cpu_optimizer_threads == 1
    assert cpu_adam_params_per_s_for(NODE, one) == pytest.approx(prof.host_adam_thread_params_per_s, rel=1e-12)
    two = one.model_copy(update={"cpu_optimizer_threads": 2})
    assert cpu_adam_params_per_s_for(NODE, two) == pytest.approx(2 * prof.host_adam_thread_params_per_s, rel=1e-12)
    many = one.model_copy(update={"cpu_optimizer_threads": 1000})
    assert cpu_adam_params_per_s_for(NODE, many) == pytest.approx(share, rel=1e-12)
    unbound = NODE.model_copy(update={"profile": prof.model_copy(update={"host_adam_thread_params_per_s": None})})
    assert cpu_adam_params_per_s_for(unbound, one) == pytest.approx(share, rel=1e-12)
    local = SMALL.num_params / 8
    upload = local * 2 / NODE.accelerator.pcie_bandwidth_bytes_per_s
    assert train_step(SMALL, NODE, one, seqs).component("optimizer") == pytest.approx(
        local / prof.host_adam_thread_params_per_s + upload, rel=1e-9)


def test_the_end_to_end_mfu_does_not_cap_training_kernels() -> None:
    # train_mfu_cap is a whole-step figure: the kernel-level step must not depend on it
    lay, seqs = TrainLayout(dp=8, micro_batch_size=2), np.full(16, 1024)
    low = NODE.model_copy(update={"profile": NODE.profile.model_copy(update={"train_mfu_cap": 0.1})})
    assert train_step(SMALL, low, lay, seqs).time_s == train_step(SMALL, NODE, lay, seqs).time_s


def test_expert_parallel_adds_all_to_all() -> None:
    c = make_cluster("h100_sxm", num_gpus=32)
    seqs = np.full(64, 2048)
    base = TrainLayout(dp=32, zero_stage=3, micro_batch_size=2)
    with_ep = base.model_copy(update={"ep": 8})
    a, b = train_step(MOE, c, base, seqs), train_step(MOE, c, with_ep, seqs)
    assert a.component("ep_comm") == 0 and b.component("ep_comm") > 0
    assert b.peak_memory_bytes < a.peak_memory_bytes


# ---------------------------------------------------------------------- work-depth bounds

layouts = st.fixed_dictionaries({
    "dp": st.sampled_from([1, 2, 4]),
    "tp": st.sampled_from([1, 2, 4, 8]),
    "pp": st.sampled_from([1, 2, 4, 7]),
    "cp": st.sampled_from([1, 2]),
    "cp_kind": st.sampled_from(["ring", "ulysses"]),
    "zero_stage": st.sampled_from([0, 1, 2, 3]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "sequence_parallel": st.booleans(),
    "overlap_grad_comm": st.booleans(),
    "micro_batch_size": st.integers(1, 4),
    "budget": st.sampled_from([None, 2048, 8192]),
    "interleave": st.booleans(),
})


def _layout(d: dict) -> TrainLayout:  # type: ignore[type-arg]
    d = dict(d)
    budget, interleave = d.pop("budget"), d.pop("interleave")
    if interleave and d["pp"] > 1:
        d.update(pp_schedule="interleaved", virtual_stages=2)
    return TrainLayout(max_tokens_per_microbatch=budget, **d)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.lists(st.integers(16, 6000), min_size=1, max_size=24), st.integers(1, 3))
def test_time_is_at_least_the_work_depth_bound(d: dict, seqs: list[int], minibatches: int) -> None:  # type: ignore[type-arg]
    lay = _layout(d)
    assume(minibatches <= len(seqs))
    gpus = lay.world_size
    cluster = make_cluster("h100_sxm", num_gpus=gpus if gpus <= 8 else -(-gpus // 8) * 8)
    try:
        cost = train_step(SMALL, cluster, lay, np.array(seqs), num_minibatches=minibatches)
    except SpecError:
        assume(False)
        return
    assert cost.time_s >= cost.lower_bound_s() * (1 - 1e-9)
    assert cost.time_s == pytest.approx(sum(v for _, v in cost.breakdown), rel=1e-9)


def _shrunk(name: str, **overrides: object) -> ModelSpec:
    return ModelSpec.from_hf_config({**load_config(name), **overrides}, f"small-{name}")


SMALL_MOE = _shrunk("Qwen3-30B-A3B", num_hidden_layers=8, num_experts=32)
SMALL_MLA = _shrunk("DeepSeek-R1", num_hidden_layers=6, first_k_dense_replace=1, n_routed_experts=32,
                    hidden_size=2048, num_attention_heads=32, num_key_value_heads=32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([SMALL_MOE, SMALL_MLA]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 1, 3]),
    st.sampled_from(["none", "full"]), st.lists(st.integers(16, 4000), min_size=1, max_size=16),
)
def test_moe_and_mla_time_is_at_least_the_bound(
    model: ModelSpec, dp: int, tp: int, pp: int, ep: int, zero: int, recompute: str, seqs: list[int]
) -> None:
    try:
        lay = TrainLayout(dp=dp, tp=tp, pp=pp, ep=ep, zero_stage=zero, recompute=recompute, micro_batch_size=2)
        gpus = lay.world_size
        cluster = make_cluster("h100_sxm", num_gpus=gpus if gpus <= 8 else -(-gpus // 8) * 8)
        cost = train_step(model, cluster, lay, np.array(seqs))
    except ValueError:  # SpecError, or the layout's own validation (ep must divide dp*cp)
        assume(False)
        return
    assert cost.time_s >= cost.lower_bound_s() * (1 - 1e-9)
    assert (cost.component("ep_comm") > 0) == (ep > 1)
